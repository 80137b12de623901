"""The room of a node's shard cache: what its folder holds, for every store, and what goes first.

``<local_cache_dir>/shard-cache/`` holds one folder per committed store read shard by shard
(named after the store and its commit's identity), and its files count against one node-wide
budget, whatever store, job or process they belong to:

* a shard file, named after its path in the store and its checksum: only ever renamed into place after
  its bytes matched that checksum, so a file's name says which bytes it holds;
* a download in progress, ``<shard file>.partial-<bytes>-<random>``: it counts as the bytes it
  will hold as soon as it is created (its name says how many); its downloader holds a lock on it,
  and one left by a process that ended (its lock is gone) is removed by the next process that looks.

A shard file is deleted only by :func:`evict`, which takes the file's exclusive lock first: a
process that maps a shard holds a shared lock on it for as long as the mapping lives, so a file
is never deleted while any process still maps it, and the bytes the disk holds are the bytes
listed here (no deleted file kept alive by a mapping).

Eviction order (:func:`eviction_order`): files no live reader's commit names first (shards of
an older commit of the store, of stores no process reads any more, stray files), then this
store's shards by next use, furthest first, then shards of stores that other live jobs read.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from lightning_tune_data.cache.owners import (
    CLAIMING_SUFFIX, claimed, is_stopped, lock_holders, remove_if_unclaimed, wait_for_lock,
)
from lightning_tune_data.cache.reader_positions import READERS_FOLDER, ReaderPositions
from lightning_tune_data.cache.sizes import human_size

__all__ = ["DOWNLOAD_LOCKS", "PARTIAL_TAG", "ROOM_LOCK", "CacheFile", "evict", "eviction_order", "holders", "stopped_holders",
           "held_only_by", "make_room", "node_contents", "partial_size", "room_lock"]

log = logging.getLogger("lightning_tune_data.cache.store")

#: Marks a download in progress: ``<shard file>.partial-<bytes>-<random>``.
PARTIAL_TAG = ".partial-"
#: The node's room lock, in the shard cache folder: room is made by one process at a time.
ROOM_LOCK = ".room.lock"
#: Folder of a store's cache holding one lock file per shard (downloads of a shard are serialised).
DOWNLOAD_LOCKS = ".locks"


@dataclass(frozen=True)
class CacheFile:
    """A file of the node's shard cache.

    Args:
        path: where it is.
        store: the store folder it is in.
        name: its path inside that folder.
        size: the bytes it counts for.
        in_progress: a download in progress (counted at its final size, never evicted).
    """

    path: Path
    store: Path
    name: str
    size: int
    in_progress: bool = False


def partial_size(name: str) -> int | None:
    """The final size a partial download's file name records (``None`` when it records none)."""
    size = name.rsplit(PARTIAL_TAG, 1)[1].split("-", 1)[0]
    return int(size) if size.isdigit() else None


def node_contents(node_folder: Path) -> list[CacheFile]:
    """Every file of the node's shard cache with the bytes it counts for; partial downloads of
    processes that ended are removed on the way."""
    found: list[CacheFile] = []
    if not node_folder.is_dir():
        return found
    for store in node_folder.iterdir():
        if not store.is_dir() or store.name.startswith("."):
            continue
        for directory, folders, names in os.walk(store):
            folders[:] = [name for name in folders if name not in (DOWNLOAD_LOCKS, READERS_FOLDER)]
            for name in names:
                if name.endswith(CLAIMING_SUFFIX):
                    continue  # a partial download a moment before it is named (counted from then on)
                path = Path(directory) / name
                relative = path.relative_to(store).as_posix()
                try:
                    actual = path.stat().st_size
                except FileNotFoundError:
                    continue
                if PARTIAL_TAG in name:
                    if not claimed(path):
                        remove_if_unclaimed(path)
                        continue
                    found.append(CacheFile(path, store, relative, max(actual, partial_size(name) or 0), True))
                else:
                    found.append(CacheFile(path, store, relative, actual))
    return found


def eviction_order(contents: list[CacheFile], own: Path, named: dict[str, int],
                   distance: Callable[[int], float], below: float | None) -> list[CacheFile]:
    """The files that may be evicted, first to go first.

    Args:
        contents: the node's files (:func:`node_contents`).
        own: this store's folder.
        named: this store's shard files by name, to their shard numbers (this commit's).
        distance: a shard's next use (larger: needed later).
        below: only shards of this store needed later than this go (a prefetch never evicts a
            shard needed sooner than the one it fetches), and no other live store's shard;
            ``None``: any.
    """
    live: dict[Path, bool] = {}
    stale, mine, others = [], [], []
    for item in contents:
        if item.in_progress:
            continue
        if item.store == own:
            shard = named.get(item.name)
            if shard is None:
                stale.append(item)
            elif below is None or distance(shard) > below:
                mine.append((-distance(shard), item))
            continue
        if item.store not in live:
            live[item.store] = ReaderPositions(item.store).any_live()
        if not live[item.store]:
            stale.append(item)
        elif below is None:
            others.append(item)
    mine.sort(key=lambda pair: pair[0])
    return stale + [item for _, item in mine] + others


@contextlib.contextmanager
def room_lock(node_folder: Path, timeout_s: float) -> Iterator[None]:
    """Hold the node's room lock (one for every store of the node), waiting at most ``timeout_s``."""
    node_folder.mkdir(parents=True, exist_ok=True)
    path = node_folder / ROOM_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        wait_for_lock(fd, path, True, timeout_s, "the node's shard cache room")
        yield
    finally:
        os.close(fd)


def make_room(node_folder: Path, budget: int, size: int, order: Callable[[list[CacheFile]], list[CacheFile]],
              evicted: Callable[[CacheFile], None] | None = None) -> tuple[bool, int]:
    """Evict files, in ``order``, until ``size`` more bytes fit in ``budget`` (under :func:`room_lock`).

    Args:
        evicted: called with each file evicted (to count them).

    Returns:
        Whether they fit, and the bytes the node's cache holds then.
    """
    contents = node_contents(node_folder)
    used = sum(item.size for item in contents)
    if used + size <= budget:
        return True, used
    for item in order(contents):
        if evict(item.path):
            log.debug("evicted %s", item.path)
            if evicted is not None:
                evicted(item)
            used -= item.size
            if used + size <= budget:
                return True, used
    return False, used


def _held_sizes(node_folder: Path) -> dict[int, list[int]]:
    """The sizes of the node's cached shards each process holds a lock on, by process id."""
    held: dict[int, list[int]] = {}
    for item in node_contents(node_folder):
        for pid in lock_holders(item.path):
            held.setdefault(pid, []).append(item.size)
    return held


def stopped_holders(node_folder: Path) -> list[int]:
    """The stopped processes among those holding the node's cached shards (waiting on them is futile
    until they resume; every other holder is a reader that lets go of shards as it moves on)."""
    return sorted(pid for pid in _held_sizes(node_folder) if is_stopped(pid))


def held_only_by(node_folder: Path, pid: int) -> bool:
    """Whether process ``pid`` alone holds the node's cached shards: a reader of that process
    waiting for room would wait for itself (its other readers let go only when it moves on)."""
    return set(_held_sizes(node_folder)) == {pid}


def holders(node_folder: Path) -> str:
    """Which processes hold the node's cached shards (for messages): ``"process 12 (3 shards, 4.0 KB), ..."``."""
    held = _held_sizes(node_folder)
    return ", ".join(f"process {pid} ({len(sizes)} shards, {human_size(sum(sizes))})"
                     for pid, sizes in sorted(held.items())) or "no process"


def evict(path: Path) -> bool:
    """Delete a shard file unless a process maps or reads it (holds a lock on it); whether it went."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    try:
        path.unlink(missing_ok=True)
    finally:
        os.close(fd)
    return True
