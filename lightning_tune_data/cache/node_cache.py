"""``NodeShardCache``: one store's shards on this node, within a byte budget, shared by every rank
and dataloader worker of the node.

Mental model. The folder ``<local_cache_dir>/shard-cache/<store>/`` mirrors the store's shard
paths. A shard is there only once it was downloaded whole and matched its checksum: it arrives
under a temporary name (``<shard>.partial-<pid>-<id>``) and is renamed into place, so a node killed
mid-download leaves nothing a later run trusts (the partial file of a dead process is removed by
the next process that looks). Two processes that want the same shard download it once: a file
lock per shard. A process reading a shard holds a shared ``flock`` on it ("pinned"); eviction
takes the exclusive lock first, so a shard in use by any reader is never evicted.

Room is made under one lock per folder, counting the shards present and the downloads in
progress. The shard evicted first is the one needed furthest in the future (or not again this
pass), as the reader that makes room tells from the computed pass order
(:meth:`NodeShardCache.set_next_use`) for itself and for every other reader of the node
(:class:`~lightning_tune_data.cache.reader_positions.ReaderPositions`): the shard's next use is
the soonest any of them needs it. A download the reader needs now waits for room while
other readers still hold every shard, then goes over the budget with a warning rather than wait
forever; a prefetch never goes over: it is tried again later.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from filelock import FileLock

from lightning_tune_data.cache.layout import process_alive
from lightning_tune_data.cache.prefetcher import ShardPrefetcher
from lightning_tune_data.cache.reader_positions import READERS_FOLDER, ReaderPositions
from lightning_tune_data.cache.shard_fetch import FetchRetries, fetch_shard
from lightning_tune_data.cache.sizes import human_size
from lightning_tune_data.cache.store_files import StoreFiles

__all__ = ["NODE_CACHE_FOLDER", "NodeShardCache"]

log = logging.getLogger("lightning_tune_data.cache.store")

#: Folder under ``local_cache_dir`` that holds the budgeted shard caches, one per store.
NODE_CACHE_FOLDER = "shard-cache"
_PARTIAL = ".partial-"
_LOCKS = ".locks"
#: How long a reader waits for other readers to free room before it goes over the budget.
ROOM_WAIT_S = 30.0
#: How often a process waiting for another one's lock looks again.
_POLL_S = 0.002


def _try_exclusive(path: Path) -> int | None:
    """An fd holding the exclusive lock on ``path``, or ``None`` when a reader pins it (or it is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


class NodeShardCache:
    """The shards of one remote store kept on this node within ``budget`` bytes.

    Args:
        files: the remote store.
        folder: this store's cache folder on the node.
        shards: every shard's entry of the commit (``path``, ``size`` and checksum), in store order.
        budget: bytes of shards kept at most (a reader that needs a shard now may go over it,
            with a warning, when other readers hold every shard).
        retries: how failing reads of a shard are retried.
        description: names the source in messages.
    """

    def __init__(self, files: StoreFiles, folder: Path, shards: list[dict[str, Any]], budget: int,
                 retries: FetchRetries = FetchRetries(), description: str = "store") -> None:
        self.files = files
        self.folder = Path(folder)
        self.shards = shards
        self.budget = int(budget)
        self.retries = retries
        self.description = description
        self._index = {entry["path"]: number for number, entry in enumerate(shards)}
        self._pins: dict[int, int] = {}  # shard -> fd holding the shared lock (this process)
        self._distance_from: Callable[[int, int], Callable[[int], float]] | None = None
        self._position: tuple[int, int] | None = None
        self._readers = ReaderPositions(self.folder)
        self._prefetcher: ShardPrefetcher | None = None
        #: Called with a shard's number when this process evicts it (its mappings are then dropped).
        self.on_evict: Callable[[int], None] | None = None
        self._warned = False
        self._pid = os.getpid()
        self.downloaded_bytes = 0  # by this process

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_pins={}, _distance_from=None, _position=None, _prefetcher=None, downloaded_bytes=0)
        return state

    def _store(self) -> StoreFiles:
        """The remote store, with a filesystem made in this process (a forked dataloader worker
        cannot use its parent's connections)."""
        if self._pid != os.getpid():
            self.files = StoreFiles(self.files.root, self.files.name)
            self._pid = os.getpid()
            self._pins, self._prefetcher, self.downloaded_bytes = {}, None, 0
        return self.files

    def path(self, shard: int) -> Path:
        """Where shard ``shard`` lives on this node (when it is there)."""
        return self.folder / self.shards[shard]["path"]

    def set_next_use(self, distance_from: Callable[[int, int], Callable[[int], float]], epoch: int, window: int) -> None:
        """Tell the cache where this reader is and how far away each shard's next use is from any
        position (larger: evicted sooner); the position is shared with the node's other readers.

        Args:
            distance_from: from a position (pass, window) to a function from a shard's number to
                how far in the pass order its next use lies.
            epoch, window: this reader's position.
        """
        self._distance_from = distance_from
        self._position = (int(epoch), int(window))
        self._readers.publish(epoch, window)

    def _next_use(self) -> Callable[[int], float]:
        """Each shard's soonest next use by any reader of the node."""
        if self._distance_from is None or self._position is None:
            return lambda shard: 0.0
        distances = [self._distance_from(*position) for position in {self._position, *self._readers.others()}]
        return lambda shard: min(distance(shard) for distance in distances)

    # -- reading ---------------------------------------------------------------------------
    def acquire(self, shard: int, wait_for_room: bool = True) -> Path:
        """Shard ``shard`` on this node, downloaded if needed, and pinned until :meth:`release`.

        Args:
            shard: the shard's number.
            wait_for_room: when other readers hold the whole budget, wait up to
                :data:`ROOM_WAIT_S` for room before going over it; ``False`` goes over it at once
                (for a shard pinned only for a moment).

        Raises:
            StorageError, ShardCorruptError, LocalDiskFullError: the download failed (see
                :func:`~lightning_tune_data.cache.shard_fetch.fetch_shard`).
        """
        self._store()
        if shard in self._pins:
            return self.path(shard)
        while True:
            if self._prefetcher is not None:
                self._prefetcher.wait_for(shard)
            self._ensure(shard, must=True, wait_s=ROOM_WAIT_S if wait_for_room else 0.0)
            path = self.path(shard)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # evicted between its download and now
                continue
            fcntl.flock(fd, fcntl.LOCK_SH)
            if os.fstat(fd).st_nlink == 0:  # evicted while we took the lock
                os.close(fd)
                continue
            self._pins[shard] = fd
            return path

    def release(self, shard: int) -> None:
        """Unpin shard ``shard`` (it may be evicted from now on; a mapping of it stays valid)."""
        fd = self._pins.pop(shard, None)
        if fd is not None:
            os.close(fd)

    def pinned(self) -> list[int]:
        """The shards this process pins."""
        return sorted(self._pins)

    def prefetch(self, shards: list[int]) -> None:
        """Download ``shards`` in the background, in the order given, as far as the budget allows
        now (replaces the previous request)."""
        self._store()
        missing = [shard for shard in shards if not self.path(shard).exists()]
        if missing:
            if self._prefetcher is None:
                self._prefetcher = ShardPrefetcher(lambda shard: self._ensure(shard, must=False))
            self._prefetcher.want(missing)

    # -- room ------------------------------------------------------------------------------
    def usage(self) -> int:
        """Bytes of shards on this node, with the downloads in progress."""
        return sum(size for _, _, size in self._contents())

    def _contents(self) -> list[tuple[Path, int | None, int]]:
        """``(path, shard number or None for a download in progress, bytes)`` of the folder;
        partial files of processes that died are removed."""
        found = []
        for directory, _, names in os.walk(self.folder):
            if _LOCKS in Path(directory).parts or READERS_FOLDER in Path(directory).parts:
                continue
            for name in names:
                path = Path(directory) / name
                relative = path.relative_to(self.folder).as_posix()
                if _PARTIAL in name:
                    owner = name.rsplit(_PARTIAL, 1)[1].split("-", 1)[0]
                    if owner.isdigit() and not process_alive(int(owner)):
                        path.unlink(missing_ok=True)
                        continue
                    shard = self._index.get(relative.rsplit(_PARTIAL, 1)[0])
                    if shard is not None:
                        found.append((path, None, int(self.shards[shard]["size"])))
                    continue
                shard = self._index.get(relative)
                if shard is not None:
                    try:
                        found.append((path, shard, path.stat().st_size))
                    except FileNotFoundError:
                        continue
        return found

    def _make_room(self, size: int) -> bool:
        """Evict unpinned shards, needed furthest away first, until ``size`` more bytes fit."""
        contents = self._contents()
        used = sum(size for _, _, size in contents)
        if used + size <= self.budget:
            return True
        distance = self._next_use()
        present = sorted((item for item in contents if item[1] is not None), key=lambda item: -distance(item[1]))
        for path, shard, shard_size in present:
            fd = _try_exclusive(path)
            if fd is None:
                continue
            try:
                path.unlink(missing_ok=True)
            finally:
                os.close(fd)
            log.debug("%s: evicted %s", self.description, self.shards[shard]["path"])
            if self.on_evict is not None:
                self.on_evict(shard)
            used -= shard_size
            if used + size <= self.budget:
                return True
        return False

    def _ensure(self, shard: int, must: bool, wait_s: float = ROOM_WAIT_S) -> bool:
        """Make sure shard ``shard`` is on this node; ``False`` when ``must`` is off and there is no room."""
        target = self.path(shard)
        if target.exists():
            return True
        entry = self.shards[shard]
        locks = self.folder / _LOCKS
        locks.mkdir(parents=True, exist_ok=True)
        with FileLock(str(locks / (entry["path"].replace("/", "__") + ".lock"))).acquire(poll_interval=_POLL_S):
            if target.exists():
                return True  # another process downloaded it meanwhile
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f"{target.name}{_PARTIAL}{os.getpid()}-{uuid.uuid4().hex[:8]}")
            waited_until = time.monotonic() + wait_s
            while True:
                with FileLock(str(locks / "room.lock")).acquire(poll_interval=_POLL_S):
                    if self._make_room(int(entry["size"])) or (must and time.monotonic() > waited_until):
                        partial.touch()  # the reservation: counted by every process from now on
                        break
                if not must:
                    return False
                time.sleep(0.05)
            if self.usage() > self.budget and wait_s > 0 and not self._warned:
                self._warned = True
                warnings.warn(
                    f"{self.description}: the node's shard cache at {self.folder} goes over its budget "
                    f"({human_size(self.usage())} > {human_size(self.budget)}): readers on this node hold every cached "
                    "shard. Raise cache_budget or lower shuffle_window.", stacklevel=2)
            try:
                fetch_shard(self._store(), entry["path"], entry, partial, self.retries, self._count)
                os.replace(partial, target)
            except BaseException:
                partial.unlink(missing_ok=True)
                raise
        return True

    def _count(self, size: int) -> None:
        self.downloaded_bytes += size
