"""How much room caches take: the bytes under a folder, what the disk holds for it (files deleted
but still mapped or open count), and a human-readable size."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["allocated_size", "human_size", "tree_size"]


def human_size(num_bytes: float) -> str:
    """Bytes as ``"12.3 MB"`` (decimal units).

    Args:
        num_bytes: A size in bytes.
    """
    for unit in ("B", "KB", "MB", "GB"):
        if num_bytes < 1000 or unit == "GB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.1f} {unit}"
        num_bytes /= 1000
    return f"{num_bytes:.1f} TB"


def tree_size(root: str | os.PathLike[str]) -> int:
    """Bytes of the regular files under ``root``.

    Args:
        root: The folder (a missing one has 0 bytes).
    """
    total = 0
    for dirpath, _, filenames in os.walk(root):
        for filename in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, filename)).st_size
            except OSError:
                pass
    return total


def _deleted_but_held(prefix: str) -> list[str]:
    """Paths (under ``/proc``) of files under ``prefix`` that were deleted but that a process
    still maps (``/proc/<pid>/maps``) or holds open (``/proc/<pid>/fd``)."""
    handles = []
    for pid in [entry for entry in os.listdir("/proc") if entry.isdigit()]:
        try:
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                fields = line.split(None, 5)
                if len(fields) == 6 and fields[5].startswith(prefix) and fields[5].endswith("(deleted)"):
                    handles.append(f"/proc/{pid}/map_files/{fields[0]}")
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(prefix) and target.endswith("(deleted)"):
                    handles.append(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
    return handles


def allocated_size(root: str | os.PathLike[str]) -> tuple[int, int]:
    """What the disk holds for ``root``: bytes of allocated blocks of the files under it, with
    the files deleted from it that any process still maps or holds open (Linux ``/proc``; reading
    other processes' maps needs the same user or root), and how many files that is.

    Args:
        root: The folder (a missing one holds nothing).
    """
    seen: dict[tuple[int, int], int] = {}
    for dirpath, _, filenames in os.walk(root):
        for filename in filenames:
            try:
                stat = os.lstat(os.path.join(dirpath, filename))
            except OSError:
                continue
            seen[(stat.st_dev, stat.st_ino)] = stat.st_blocks * 512
    for handle in _deleted_but_held(os.fspath(Path(root).absolute())):
        try:
            stat = os.stat(handle)
        except OSError:
            continue
        seen[(stat.st_dev, stat.st_ino)] = stat.st_blocks * 512
    return sum(seen.values()), len(seen)
