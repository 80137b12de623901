"""How much room caches take: the bytes under a folder, and a human-readable size."""

from __future__ import annotations

import os

__all__ = ["human_size", "tree_size"]


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
