"""Whether a folder can hold a node's shard cache: a node-local disk with room for the budget.

The shard cache relies on ``flock`` locks that belong to an open file and on memory-mapping
files that another process of the node may delete. On a network filesystem (NFS, SMB/CIFS,
Lustre, GPFS, BeeGFS, CephFS, a FUSE mount ...) locks are emulated or not shared between nodes,
closing any descriptor drops them, and a file removed by another client can make mapped pages
fail: the cache would evict shards in use and crash readers. The kind of filesystem is told by
``statfs``'s magic number; such a folder is refused at setup, naming the fix.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

from lightning_tune_data.cache.sizes import human_size

__all__ = ["NETWORK_FILESYSTEMS", "check_shard_cache_disk", "filesystem_magic", "network_filesystem"]

#: ``statfs`` magic numbers of filesystems shared between machines, by name.
NETWORK_FILESYSTEMS = {
    0x6969: "NFS",
    0x517B: "SMB",
    0xFF534D42: "CIFS",
    0xFE534D42: "SMB2",
    0x0BD00BD0: "Lustre",
    0x47504653: "GPFS",
    0x19830326: "BeeGFS",
    0x65735546: "FUSE",
    0x00C36400: "CephFS",
    0x5346414F: "AFS",
    0x6B414653: "AFS",
    0x01021997: "9P",
    0x013111A8: "IBRIX",
    0x7461636F: "OCFS2",
    0x01161970: "GFS2",
}


class _StatFs(ctypes.Structure):
    # Linux's struct statfs begins with the filesystem type (a word); the rest is read as padding.
    _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 256)]


def filesystem_magic(path: str | os.PathLike[str]) -> int | None:
    """The ``statfs`` magic number of the filesystem holding ``path`` (``None`` when unknown)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    result = _StatFs()
    if libc.statfs(os.fsencode(os.fspath(path)), ctypes.byref(result)) != 0:
        return None
    return int(result.f_type) & 0xFFFFFFFF


def network_filesystem(magic: int | None) -> str | None:
    """The name of the network filesystem of ``magic`` (a ``statfs`` magic number), ``None`` for a local one."""
    return None if magic is None else NETWORK_FILESYSTEMS.get(magic)


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_shard_cache_disk(folder: str | os.PathLike[str], budget: int, used: int, description: str) -> None:
    """Refuse a shard cache ``folder`` on a network filesystem, or on a disk without room for ``budget``.

    Args:
        folder: where the node's shard cache lives (it need not exist yet).
        budget: the node's ``cache_budget`` in bytes.
        used: bytes the cache already holds there (they count as room).
        description: names the source in errors.

    Raises:
        ValueError: the folder is on a network filesystem, or the disk's free space plus what
            the cache holds is below the budget.
    """
    where = _existing(Path(folder).absolute())
    kind = network_filesystem(filesystem_magic(where))
    if kind is not None:
        raise ValueError(
            f"{description}: local_cache_dir {folder} is on a network filesystem ({kind}); the node's shard cache needs "
            "a node-local disk (its locks and memory maps are not safe there). Point local_cache_dir at the node's "
            "local disk (e.g. /local/nvme/lightning_tune_data or $TMPDIR).")
    stats = os.statvfs(where)
    free = stats.f_bavail * stats.f_frsize
    if free + used < budget:
        raise ValueError(
            f"{description}: cache_budget {human_size(budget)} is more than the disk of local_cache_dir {folder} has "
            f"free ({human_size(free)}, plus {human_size(used)} the shard cache holds). Lower cache_budget, or point "
            "local_cache_dir at a larger disk.")
