"""Where things live in a cache root, and how they are named.

A cache root (``cache_dir``) holds, side by side:

* finished caches ``<source key>-<fingerprint[:16]>/`` (the key is the source's name, made safe for
  a folder name); a cache is found by its fingerprint whatever its key, so renaming a source does
  not rebuild it;
* ``.<cache>.tmp-<pid>-<random>/``: the temporary folder of a build in progress (or of one that
  was killed), renamed into place when the build completes;
* ``<cache>.lock``: the file lock that serialises builds of one cache;
* :data:`~lightning_tune_data.cache.checksums.FILE_HASH_MEMO`: remembered hashes of data files;
* :data:`DOWNLOAD_FOLDER`: the ``datasets`` library's own conversions of local data files.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning_tune_data.cache.marker import is_valid_cache

__all__ = ["DOWNLOAD_FOLDER", "cache_folder", "find_cache", "is_orphan_lock", "is_temporary_folder", "lock_path", "other_caches", "safe_name", "temporary_prefix"]

#: Folder of a cache root where ``datasets`` keeps what it converts from local data files.
DOWNLOAD_FOLDER = "hf_datasets"
#: Marks the temporary folder of a build (after the leading ``.`` and the cache's name).
TEMPORARY_TAG = ".tmp-"
#: Suffix of the lock file beside each cache folder.
LOCK_SUFFIX = ".lock"


def safe_name(text: str, limit: int = 80) -> str:
    """``text`` as a folder name: runs of characters other than letters, digits, ``.``, ``_``
    and ``-`` become ``_``, at most ``limit`` characters; ``"source"`` when nothing is left.

    Args:
        text: Any name (a source name, a dataset path).
        limit: Longest name returned.
    """
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._-")[:limit] or "source"


def cache_folder(cache_root: str | os.PathLike[str], key: str, fingerprint: str) -> Path:
    """The folder a new cache of ``fingerprint`` is built in: ``<cache_root>/<key>-<fingerprint[:16]>``.

    Args:
        cache_root: The cache root.
        key: The source's folder-safe name.
        fingerprint: The cache's fingerprint.
    """
    return Path(cache_root) / f"{key}-{fingerprint[:16]}"


def find_cache(cache_root: str | os.PathLike[str], fingerprint: str, metadata: Mapping[str, Any]) -> Path | None:
    """A complete cache of this fingerprint under ``cache_root``, whatever its name prefix.

    Args:
        cache_root: The cache root.
        fingerprint: The fingerprint the folder name ends with.
        metadata: What the cache's marker must hold.
    """
    root = Path(cache_root)
    if not root.is_dir():
        return None
    for candidate in sorted(root.glob(f"*-{fingerprint[:16]}")):
        if candidate.is_dir() and is_valid_cache(candidate, metadata):
            return candidate
    return None


def other_caches(cache_root: str | os.PathLike[str], key: str) -> list[str]:
    """Names of the complete caches built under ``key`` (any configuration), sorted.

    Args:
        cache_root: The cache root.
        key: The source's folder-safe name.
    """
    return sorted(p.name for p in Path(cache_root).glob(f"{key}-*") if p.is_dir() and is_valid_cache(p))


def lock_path(final_dir: str | os.PathLike[str]) -> Path:
    """The lock file that serialises builds of the cache at ``final_dir``.

    Args:
        final_dir: The cache folder.
    """
    return Path(f"{os.fspath(final_dir)}{LOCK_SUFFIX}")


def temporary_prefix(final_dir: Path) -> str:
    """Name prefix of the temporary folders that builds of ``final_dir`` fill.

    Args:
        final_dir: The cache folder.
    """
    return f".{final_dir.name}{TEMPORARY_TAG}"


def is_temporary_folder(path: Path) -> bool:
    """Whether ``path`` is the temporary folder of a build (in progress or killed).

    Args:
        path: An entry of a cache root.
    """
    return path.is_dir() and path.name.startswith(".") and TEMPORARY_TAG in path.name


def is_orphan_lock(path: Path) -> bool:
    """Whether ``path`` is a lock file whose cache folder does not exist.

    Args:
        path: An entry of a cache root.
    """
    return path.suffix == LOCK_SUFFIX and not path.with_suffix("").exists()
