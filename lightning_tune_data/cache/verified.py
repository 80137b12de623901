"""Which files of a local cache were verified against their checksums, and in what state.

Hashing every byte of a store at every start costs about 0.17 s per GB (minutes per node on a
corpus of terabytes). A file's checksum is therefore verified when it is written or downloaded,
and this record remembers the file's *stamp* at that moment (size, modification time in ns,
inode). Reopening checks the stamps only; a file whose stamp changed (rewritten, patched,
replaced) is hashed again. A full re-hash stays available (``cache_verify="full"`` and
``lightning-tune-data cache verify``).
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = ["VERIFIED_RECORD", "file_stamp", "read_verified", "record_verified"]

#: The record, inside a local cache folder (never part of the cache's checksummed files).
VERIFIED_RECORD = "_VERIFIED.json"


def file_stamp(path: str | os.PathLike[str]) -> list[int] | None:
    """``[size, mtime_ns, inode]`` of a file, ``None`` when it does not exist."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return [stat.st_size, stat.st_mtime_ns, stat.st_ino]


def read_verified(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """``{relative path: stamp when verified}`` (empty when nothing was recorded)."""
    try:
        content = json.loads((Path(folder) / VERIFIED_RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return content if isinstance(content, dict) else {}


def record_verified(folder: str | os.PathLike[str], relatives: Iterable[str]) -> None:
    """Remember the current stamps of ``relatives`` as verified (best effort: a read-only
    folder just verifies again next time).

    Args:
        folder: The local cache folder.
        relatives: Files (relative posix paths) whose checksums were just verified.
    """
    folder = Path(folder)
    record = read_verified(folder)
    for relative in relatives:
        stamp = file_stamp(folder / relative)
        if stamp is not None:
            record[relative] = stamp
    temp = folder / f".{VERIFIED_RECORD}.{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        temp.write_text(json.dumps(record, sort_keys=True), encoding="utf-8")
        os.replace(temp, folder / VERIFIED_RECORD)
    except OSError:
        try:
            temp.unlink(missing_ok=True)
        except OSError:
            pass
