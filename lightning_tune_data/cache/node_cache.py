"""``NodeShardCache``: one store's shards on this node, within the node's byte budget, shared by
every rank and dataloader worker of the node (and every other store read shard by shard there).

Mental model. The store's folder is ``<local_cache_dir>/shard-cache/<store>-<commit>/``, named
after the commit's identity (every shard's path, size and checksum), and a shard's file there is
named after its path and checksum: a file is used only when it is the file this commit names, and only
once its size matches (it was renamed into place after its bytes matched the checksum). A
store prepared again, with other shards at the same paths, never reads the old files; they count
against the budget until they are evicted, first (see :mod:`lightning_tune_data.cache.node_room`).

A shard arrives under a temporary name that its downloader holds a lock on, so a node killed
mid-download leaves nothing a later run trusts. Two processes that want the same shard download
it once: a lock per shard. A process reading or mapping a shard holds a shared lock on it;
eviction takes the exclusive lock first, so a shard any process maps is never deleted.

Room is made under one lock for the whole node, counting every store's shards and downloads.
``budget`` is the node's: the bytes of the node's shard cache never exceed it, except by one
shard at a time for a reader that needs a shard now while the other readers hold every byte
(after waiting :data:`ROOM_WAIT_S`, with a warning). Readers that each pin their windows can
wait for one another; past the wait they go on over the budget rather than deadlock, unless a
holder is stopped (then the wait ends in an error naming it). A prefetch never goes over it, and never
evicts a shard needed sooner than the one it fetches. Every wait is bounded: a lock held by a
stopped or hung process is named after :data:`LOCK_WAIT_S` without progress.
"""

from __future__ import annotations

import contextlib
import mmap
import multiprocessing.util
import os
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

import xxhash

from lightning_tune_data.cache.cache_counters import CacheCounters
from lightning_tune_data.cache.checksums import CHECKSUM_ALGORITHM
from lightning_tune_data.cache.fingerprints import canonical_json
from lightning_tune_data.cache.node_room import (
    DOWNLOAD_LOCKS, PARTIAL_TAG, evict, eviction_order, held_only_by, holders, make_room, node_contents, room_lock,
    stopped_holders,
)
from lightning_tune_data.cache.owners import (
    LockWaitTimeout, after_fork_in_child, claim, forget_held, hold, release, wait_for_lock,
)
from lightning_tune_data.cache.prefetcher import ShardPrefetcher
from lightning_tune_data.cache.reader_positions import ReaderPositions
from lightning_tune_data.cache.shard_fetch import FetchRetries, fetch_shard
from lightning_tune_data.cache.sizes import human_size
from lightning_tune_data.cache.store_files import StoreFiles

__all__ = ["LOCK_WAIT_S", "NODE_CACHE_FOLDER", "ROOM_WAIT_S", "NodeShardCache", "cached_name", "commit_identity"]

#: Folder under ``local_cache_dir`` that holds the node's shard cache, one folder per store.
NODE_CACHE_FOLDER = "shard-cache"
#: How long a reader that needs a shard waits for other readers to free room before it goes
#: over the budget by that one shard (readers moving on free room within milliseconds to seconds).
ROOM_WAIT_S = 30.0
#: The longest wait for a lock (or for room) while its holder makes no progress.
LOCK_WAIT_S = 120.0


class _CacheClosed(Exception):
    """The cache was closed while a download was in flight."""


def cached_name(entry: dict[str, Any]) -> str:
    """A shard's file name in the node cache: its path in the store with its checksum (or size)
    before the extension (``shards/task-0-of-1/00000.<checksum>.arrow``)."""
    tag = str(entry.get(CHECKSUM_ALGORITHM) or f"{int(entry['size'])}b")[:16]
    path = PurePosixPath(entry["path"])
    return str(path.with_name(f"{path.stem}.{tag}{path.suffix}"))


def commit_identity(shards: list[dict[str, Any]]) -> str:
    """16 hex digits naming a commit's shards: their paths, sizes and checksums."""
    listed = [[entry["path"], int(entry["size"]), entry.get(CHECKSUM_ALGORITHM)] for entry in shards]
    return xxhash.xxh3_64(canonical_json(listed).encode()).hexdigest()


class _Held:
    """What a cache holds that must be let go of when it is closed or garbage collected."""

    def __init__(self, folder: Path) -> None:
        self.pins: dict[int, int] = {}  # shard -> descriptor holding its shared lock
        self.prefetcher: ShardPrefetcher | None = None
        self.readers = ReaderPositions(folder)

    def close(self) -> None:
        """Idempotent."""
        if self.prefetcher is not None:
            self.prefetcher.stop()
        for fd in self.pins.values():
            forget_held(fd)
        self.pins.clear()
        self.readers.close()


def _partial_bytes(target: Path) -> int:
    """Bytes of the partial downloads of ``target`` (they grow while a download makes progress)."""
    total = 0
    for partial in target.parent.glob(target.name + PARTIAL_TAG + "*"):
        with contextlib.suppress(FileNotFoundError):
            total += partial.stat().st_size
    return total


def _went_over_budget(cache: NodeShardCache, total: int) -> None:
    """Count a reader going over the budget by a shard (``total`` bytes then), warning once per cache."""
    cache.counters.add("over_budget")
    if cache._warned:
        return
    cache._warned = True
    warnings.warn(
        f"{cache.description}: the node's shard cache at {cache.node_folder} goes over its budget by one shard "
        f"({human_size(total)} > {human_size(cache.budget)}): readers on this node hold every cached shard. Raise "
        "cache_budget or lower shuffle_window.", stacklevel=5)


def _no_room(cache: NodeShardCache, waited: float, size: int, used: int) -> str:
    """The error of a reader that waited too long for ``size`` bytes of room."""
    return (f"{cache.description}: waited {waited:.0f} s for {human_size(size)} of room in the node's shard cache at "
            f"{cache.node_folder} ({human_size(used)} used of a {human_size(cache.budget)} cache_budget): readers of "
            f"this node hold every cached shard ({holders(cache.node_folder)}), a stopped one among them, and the cache "
            "is already over the budget. Resume or end the stopped process, raise cache_budget or lower shuffle_window.")


def _close_if_alive(held: weakref.ref[_Held]) -> None:
    alive = held()
    if alive is not None:
        alive.close()


class NodeShardCache:
    """The shards of one remote store kept on this node, within the node's ``budget``.

    Args:
        files: the remote store.
        folder: the node's shard cache (``<local_cache_dir>/shard-cache``); the store's own
            folder in it is named after the store and its commit.
        shards: every shard's entry of the commit (``path``, ``size`` and checksum), in store order.
        budget: bytes of shards this node keeps, for every store read shard by shard.
        retries: how failing reads of a shard are retried.
        description: names the source in messages.
    """

    #: Writes a shard's verified bytes to a local file (a corpus read by byte ranges sets its own).
    fetch: Callable[..., None] = staticmethod(fetch_shard)

    def __init__(self, files: StoreFiles, folder: Path, shards: list[dict[str, Any]], budget: int,
                 retries: FetchRetries = FetchRetries(), description: str = "store") -> None:
        self.files = files
        self.node_folder = Path(folder)
        self.folder = self.node_folder / f"{files.name}-{commit_identity(shards)[:12]}"
        self.shards = shards
        self.budget = int(budget)
        self.retries = retries
        self.description = description
        self._names = [cached_name(entry) for entry in shards]
        self._index = {name: number for number, name in enumerate(self._names)}
        self._distance_from: Callable[[int, int], Callable[[int], float]] | None = None
        self._position: tuple[int, int] | None = None
        self.counters = CacheCounters()  # what it did, in every process that reads it
        self._start_here()

    def _start_here(self) -> None:
        """This process's state (new, or in a forked child: nothing inherited is kept)."""
        self._held = _Held(self.folder)
        self._finalizer = weakref.finalize(self, _Held.close, self._held)
        self._guard = threading.Lock()
        self._warned = False
        self.downloaded_bytes = 0  # by this process
        #: Called from the reading thread while it waits for room: this process lets go of what
        #: it maps without needing it now.
        self.on_room_needed: Callable[[], None] | None = None
        after_fork_in_child(self, NodeShardCache._forget_inherited)

    def _forget_inherited(self) -> None:
        self._finalizer.detach()
        self._held.readers.forget_inherited()
        self.files = StoreFiles(self.files.root, self.files.name)  # a parent's connections are not this process's
        self._start_here()

    def __getstate__(self) -> dict[str, Any]:
        skipped = ("_held", "_finalizer", "_guard", "on_room_needed")
        return {**{k: v for k, v in self.__dict__.items() if k not in skipped}, "_distance_from": None, "_position": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.files = StoreFiles(self.files.root, self.files.name)
        self._start_here()

    def close(self) -> None:
        """Stop the prefetch threads (a download in flight is abandoned) and let go of every pin
        (also done when the cache is garbage collected, or its process ends); reading again
        afterwards starts afresh."""
        self._finalizer()
        self._held = _Held(self.folder)
        self._finalizer = weakref.finalize(self, _Held.close, self._held)

    def path(self, shard: int) -> Path:
        """Where shard ``shard`` lives on this node (when it is there)."""
        return self.folder / self._names[shard]

    def set_next_use(self, distance_from: Callable[[int, int], Callable[[int], float]], epoch: int, window: int) -> None:
        """Tell the cache where this reader is and how far away each shard's next use is from any
        position (larger: evicted sooner); the position is shared with the node's other readers.

        Args:
            distance_from: from a position (pass, window) to a function from a shard's number to
                how far in the pass order its next use lies; called from the prefetch threads
                too, so it must be safe to call from any thread.
            epoch, window: this reader's position.
        """
        self._distance_from = distance_from
        self._position = (int(epoch), int(window))
        self._held.readers.publish(epoch, window)

    def _next_use(self) -> Callable[[int], float]:
        """Each shard's soonest next use by any reader of the node."""
        distance_from, position = self._distance_from, self._position
        if distance_from is None or position is None:
            return lambda shard: 0.0
        distances = [distance_from(*where) for where in {position, *self._held.readers.others()}]
        return lambda shard: min(distance(shard) for distance in distances)

    # -- reading ---------------------------------------------------------------------------
    def acquire(self, shard: int) -> Path:
        """Shard ``shard`` on this node, downloaded if needed, and pinned until :meth:`release`.

        Raises:
            StorageError, ShardCorruptError, LocalDiskFullError: the download failed (see
                :func:`~lightning_tune_data.cache.shard_fetch.fetch_shard`).
            LockWaitTimeout: a process holding the shard's lock (or every byte of the budget)
                made no progress for :data:`LOCK_WAIT_S`.
        """
        pins = self._held.pins
        if shard in pins:
            return self.path(shard)
        self._held.readers.register()
        started, hit = time.monotonic(), self._present(shard)
        self.counters.add("hits" if hit else "misses")
        while True:
            if self._held.prefetcher is not None:
                self._held.prefetcher.wait_for(shard)
            self._ensure(shard, must=True)
            path = self.path(shard)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:  # evicted between its download and now
                continue
            try:
                wait_for_lock(fd, path, False, LOCK_WAIT_S, f"shard {self.shards[shard]['path']} of {self.description}")
            except BaseException:
                os.close(fd)
                raise
            if os.fstat(fd).st_nlink == 0:  # evicted while we took the lock
                os.close(fd)
                continue
            pins[shard] = hold(fd)
            if not hit:
                self.counters.add("wait_s", time.monotonic() - started)
            return path

    def release(self, shard: int) -> None:
        """Unpin shard ``shard`` (a mapping made by :meth:`map` keeps its own lock)."""
        fd = self._held.pins.pop(shard, None)
        if fd is not None:
            forget_held(fd)

    def map(self, shard: int) -> mmap.mmap:
        """Shard ``shard`` memory-mapped; the file stays on the node for as long as the mapping
        lives (the mapping holds the shard's shared lock: it is dropped with the last view)."""
        pinned_before = shard in self._held.pins
        self.acquire(shard)
        # mmap keeps its own duplicate of the pin's descriptor: the same open file, so the same
        # lock, held until the mapping is gone whatever happens to the pin
        mapping = mmap.mmap(self._held.pins[shard], 0, access=mmap.ACCESS_READ)
        if not pinned_before:
            self.release(shard)
        return mapping

    def pinned(self) -> list[int]:
        """The shards this process pins."""
        return sorted(self._held.pins)

    def prefetch(self, shards: list[int]) -> None:
        """Download ``shards`` in the background, in the order given, as far as the budget allows
        now (replaces the previous request)."""
        missing = [shard for shard in shards if not self._present(shard)]
        if missing:
            if self._held.prefetcher is None:
                method = weakref.WeakMethod(self._ensure)  # the threads must not keep the cache alive
                self._held.prefetcher = ShardPrefetcher(lambda shard: bool((ensure := method()) and ensure(shard, False)))
                # a dataloader worker ends without running ``atexit``: close there too
                multiprocessing.util.Finalize(None, _close_if_alive, args=(weakref.ref(self._held),), exitpriority=10)
            self._held.prefetcher.want(missing)

    # -- room ------------------------------------------------------------------------------
    def node_usage(self) -> int:
        """Bytes the node's shard cache holds, every store's, downloads in progress included."""
        return sum(item.size for item in node_contents(self.node_folder))

    def _present(self, shard: int) -> bool:
        try:
            return self.path(shard).stat().st_size == int(self.shards[shard]["size"])
        except FileNotFoundError:
            return False

    def _reserve(self, shard: int, must: bool) -> tuple[Path, int] | None:
        """Room for shard ``shard``: a partial file claimed by this process (counted by every
        process from now on), or ``None`` when there is none now and ``must`` is off."""
        size = int(self.shards[shard]["size"])
        target = self.path(shard)
        started = time.monotonic()
        before = None if must else self._next_use()(shard)
        delay = 0.01
        while True:
            with room_lock(self.node_folder, LOCK_WAIT_S):
                fits, used = make_room(self.node_folder, self.budget, size,
                                       lambda contents: eviction_order(contents, self.folder, self._index, self._next_use(),
                                                                       before),
                                       lambda item: self.counters.add("evictions"))
                waited = time.monotonic() - started
                # after the wait, or once its readers let go (delay grew) when this process alone holds the shards;
                # when already over, only while every holder runs (readers could wait for each other forever)
                alone = not fits and must and delay > 0.01 and held_only_by(self.node_folder, os.getpid())  # waits for itself
                over = not fits and must and (waited > ROOM_WAIT_S or alone) and (used <= self.budget or not stopped_holders(self.node_folder))
                if fits or over:
                    if over:
                        _went_over_budget(self, used + size)
                    partial = target.with_name(f"{target.name}{PARTIAL_TAG}{size}-{uuid.uuid4().hex[:8]}")
                    return partial, claim(partial)
            if not must:
                return None
            if self.on_room_needed is not None:
                self.on_room_needed()
            if waited > ROOM_WAIT_S + LOCK_WAIT_S:
                raise LockWaitTimeout(_no_room(self, waited, size, used))
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _ensure(self, shard: int, must: bool) -> bool:
        """Make sure shard ``shard`` is on this node; ``False`` when ``must`` is off and there is no room."""
        if self._present(shard):
            return True
        target = self.path(shard)
        locks = self.folder / DOWNLOAD_LOCKS
        locks.mkdir(parents=True, exist_ok=True)
        lock_path = locks / (self._names[shard].replace("/", "__") + ".lock")
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            wait_for_lock(fd, lock_path, True, LOCK_WAIT_S, f"the download of {target.name}",
                          progress=lambda: _partial_bytes(target))
            if self._present(shard):
                return True  # another process downloaded it meanwhile
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                evict(target)  # a file of the right name but not the recorded size: never trusted
            reserved = self._reserve(shard, must)
            if reserved is None:
                return False
            partial, owner = reserved
            try:
                self.fetch(self.files, self.shards[shard]["path"], self.shards[shard], partial, self.retries,
                           self._count)
                os.replace(partial, target)
            except BaseException:
                partial.unlink(missing_ok=True)
                raise
            finally:
                release(owner)
        finally:
            os.close(fd)
        return True

    def _count(self, size: int) -> None:
        prefetcher = self._held.prefetcher
        if prefetcher is not None and prefetcher.stopped and prefetcher.runs_here():
            raise _CacheClosed(f"{self.description}: the cache was closed")
        with self._guard:
            self.downloaded_bytes += size
        self.counters.add("downloaded_bytes", size)
