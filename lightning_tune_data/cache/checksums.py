"""Content hashes of files: data-file identities, and per-file checksums of caches.

Data files are identified by their content (:func:`file_identity`), not their modification
time, so ``touch`` does not invalidate a cache.

A finished cache records, for every file it holds, the size and an xxHash (``xxh3_128``, a
fast non-cryptographic hash) of the bytes. Reusing a cache checks them in one of two modes:

* ``"checksum"`` (default): a file is hashed when it is written or downloaded and again whenever
  it changed since (its size, modification time or inode differ from when it was last verified,
  see :mod:`lightning_tune_data.cache.verified`); an unchanged file costs one ``stat``. A patched
  or rewritten file is found, whatever its size.
* ``"full"``: every byte is read and hashed at every check (one sequential read of the cache,
  about 0.17 s per GB), so even a corruption that kept the file's modification time is found.
* ``"size"``: only the file sizes are compared.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import xxhash

from lightning_tune_data.cache.verified import file_stamp, read_verified, record_verified

__all__ = [
    "CHECKSUM_ALGORITHM",
    "FILE_HASH_MEMO",
    "READ_CHUNK_BYTES",
    "VERIFY_MODES",
    "VerifyMode",
    "file_checksum",
    "file_identity",
    "tree_checksums",
    "verify_files",
]

#: The hash recorded per file (name stored with it, so it can change later).
CHECKSUM_ALGORITHM = "xxh3_128"
VerifyMode = Literal["checksum", "size", "full"]
#: How a reused cache's files are checked.
VERIFY_MODES: tuple[str, ...] = VerifyMode.__args__
#: Bytes read at a time when hashing a file.
READ_CHUNK_BYTES = 8 << 20
#: Remembers the content hash of data files by (size, mtime, inode), so unchanged files are
#: not re-read and a ``touch`` costs one re-hash, not a rebuild. Lives in the cache root.
FILE_HASH_MEMO = ".file-hashes.json"
_memo: dict[str, dict[str, Any]] = {}


def file_checksum(path: str | os.PathLike[str]) -> str:
    """The ``xxh3_128`` hex digest of a file's bytes (read in 8 MiB chunks).

    Args:
        path: The file to hash.
    """
    digest = xxhash.xxh3_128()
    buffer = bytearray(READ_CHUNK_BYTES)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while True:
            read = handle.readinto(buffer)
            if not read:
                break
            digest.update(view[:read])
    return digest.hexdigest()


def tree_checksums(root: str | os.PathLike[str], exclude: Iterable[str] = ()) -> dict[str, dict[str, int | str]]:
    """``{relative posix path: {"size", "xxh3_128"}}`` for every regular file under ``root``.

    Args:
        root: The directory to describe.
        exclude: Relative paths to leave out (e.g. the completion marker itself).
    """
    root = Path(root)
    skipped = set(exclude)
    files: dict[str, dict[str, int | str]] = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if relative in skipped or not path.is_file() or path.is_symlink():
            continue
        files[relative] = {"size": path.stat().st_size, CHECKSUM_ALGORITHM: file_checksum(path)}
    return files


def verify_files(root: str | os.PathLike[str], recorded: Mapping[str, Mapping[str, int | str]],
                 mode: VerifyMode = "checksum") -> str | None:
    """Check the files under ``root`` against what was recorded when they were written.

    Args:
        root: The cache directory.
        recorded: The output of :func:`tree_checksums` at write time.
        mode: ``"checksum"`` (sizes, and hashes of the files changed since they were last
            verified), ``"full"`` (sizes and every hash) or ``"size"`` (sizes only).

    Returns:
        ``None`` when every file matches, else a description naming the first bad file.
    """
    if mode not in VERIFY_MODES:
        raise ValueError(f"cache verification mode {mode!r} is not one of {VERIFY_MODES}.")
    root = Path(root)
    for relative, expected in recorded.items():  # sizes first: cheap, and they name truncations
        path = root / relative
        if not path.is_file():
            return f"file {path} is missing"
        size = path.stat().st_size
        if size != expected.get("size"):
            return f"file {path} has {size} bytes, {expected.get('size')} were written (truncated or overwritten)"
    if mode == "size":
        return None
    verified = read_verified(root) if mode == "checksum" else {}
    hashed: list[str] = []
    for relative, expected in recorded.items():
        want = expected.get(CHECKSUM_ALGORITHM)
        if want is None or (verified.get(relative) is not None and verified.get(relative) == file_stamp(root / relative)):
            continue
        got = file_checksum(root / relative)
        if got != want:
            return (f"file {root / relative} does not match the checksum recorded when it was written "
                    f"({CHECKSUM_ALGORITHM} {got} != {want}): its bytes changed on disk")
        hashed.append(relative)
    if hashed:
        record_verified(root, hashed)
    return None


def _memo_path(memo_dir: str | os.PathLike[str] | None) -> Path | None:
    return None if memo_dir is None else Path(memo_dir) / FILE_HASH_MEMO


def _load_memo(memo_path: Path | None) -> dict[str, Any]:
    if memo_path is None or not memo_path.parent.is_dir():
        return {}  # nowhere to keep it (yet): nothing to remember across calls
    key = str(memo_path)
    if key not in _memo:
        try:
            loaded = json.loads(memo_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            loaded = {}
        _memo[key] = loaded if isinstance(loaded, dict) else {}
    return _memo[key]


def _save_memo(memo_path: Path, memo: dict[str, Any]) -> None:
    """Best effort (a read-only cache root just re-hashes changed files next time)."""
    temp = memo_path.with_name(f"{memo_path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
    if not memo_path.parent.is_dir():  # never create the cache root just for the memo
        return
    try:
        temp.write_text(json.dumps(memo, sort_keys=True), encoding="utf-8")
        os.replace(temp, memo_path)
    except OSError:
        try:
            temp.unlink(missing_ok=True)
        except OSError:
            pass


def file_identity(path: str | os.PathLike[str], memo_dir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Identify a data file by its content: resolved path, size and an xxHash of every byte.

    The modification time is not part of it, so ``touch`` does not change the identity. The
    hash is remembered in ``memo_dir/.file-hashes.json`` keyed by (size, mtime, inode), so a
    file is read again only when one of those changed.

    Args:
        path: A regular file.
        memo_dir: Where the hash memo lives (the cache root); ``None`` hashes every time.

    Returns:
        ``{"path", "size", "xxh3_128"}``.

    Raises:
        FileNotFoundError: ``path`` does not exist or is not a regular file.
    """
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise FileNotFoundError(f"data file not found (or not a regular file): {resolved}")
    stat = resolved.stat()
    stamp = [stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_dev]
    memo_path = _memo_path(memo_dir)
    memo = _load_memo(memo_path)
    entry = memo.get(str(resolved))
    if isinstance(entry, dict) and entry.get("stamp") == stamp and CHECKSUM_ALGORITHM in entry:
        digest = entry[CHECKSUM_ALGORITHM]
    else:
        digest = file_checksum(resolved)
        if memo_path is not None:
            memo[str(resolved)] = {"stamp": stamp, CHECKSUM_ALGORITHM: digest}
            _save_memo(memo_path, memo)
    return {"path": str(resolved), "size": stat.st_size, CHECKSUM_ALGORITHM: digest}
