"""Preprocessing caches: content fingerprints and crash-safe, lock-guarded atomic writes.

A cache directory is *valid* only when it holds the completion marker ``_COMPLETE.json`` whose
metadata matches what the reader expects. Caches are built in a temporary directory beside the
final one, the marker is written last, everything is fsynced, and the directory is renamed into
place, all under a file lock (``<final_dir>.lock``). A process killed at any point therefore
leaves either nothing, or a temporary directory that is never read and is removed by the next
build, or a complete cache.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import os
import shutil
import uuid
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from filelock import FileLock

import lightning_tune_data

__all__ = [
    "CACHE_FORMAT_VERSION",
    "COMPLETE_MARKER",
    "build_cache_atomically",
    "callable_identity",
    "canonical_json",
    "file_identity",
    "fingerprint",
    "is_valid_cache",
    "read_cache_metadata",
]

log = logging.getLogger(__name__)

#: Bump when the on-disk layout of caches changes; it is part of every fingerprint and marker.
CACHE_FORMAT_VERSION = 1
#: Name of the completion marker, written last into a finished cache directory.
COMPLETE_MARKER = "_COMPLETE.json"
_MIB = 1 << 20


def callable_identity(fn: Any) -> dict[str, Any]:
    """Describe a callable so that editing its code changes the description.

    Args:
        fn: A function, ``functools.partial``, bound method or callable object.

    Returns:
        ``{"module", "qualname", "source_sha256"}`` (``source_sha256`` is ``None`` when the source
        is unavailable, e.g. for builtins); partials also record their bound arguments.
    """
    if isinstance(fn, functools.partial):
        return {
            "partial": callable_identity(fn.func),
            "args": list(fn.args),
            "keywords": dict(fn.keywords),
        }
    target = getattr(fn, "__func__", fn)  # bound methods: the function
    if not (inspect.isfunction(target) or inspect.isclass(target) or inspect.isbuiltin(target)):
        target = type(target)  # callable instances: their class
    try:
        source_hash: str | None = hashlib.sha256(inspect.getsource(target).encode()).hexdigest()
    except (OSError, TypeError):
        source_hash = None
    return {
        "module": getattr(target, "__module__", None),
        "qualname": getattr(target, "__qualname__", repr(target)),
        "source_sha256": source_hash,
    }


def _json_default(value: Any) -> Any:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, bytes):
        return value.hex()
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return value.item()
    if callable(value):
        return callable_identity(value)
    text = repr(value)
    if " at 0x" in text:
        raise TypeError(
            f"cannot fingerprint a value of type {type(value).__name__} ({text}): its repr is not "
            f"stable across runs. Use plain JSON values (str, int, float, bool, list, dict) in "
            f"configuration that keys the cache."
        )
    return {"repr": text, "type": f"{type(value).__module__}.{type(value).__qualname__}"}


def canonical_json(obj: Any) -> str:
    """Serialise ``obj`` deterministically (sorted keys, no whitespace) for hashing/comparison."""
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=_json_default
    )


def fingerprint(parts: Mapping[str, Any]) -> str:
    """Stable sha256 hex digest of everything that changes a cache's content.

    The package version and :data:`CACHE_FORMAT_VERSION` are added here, so callers pass only
    their own parts (source spec, data-file identities, preprocess function identity and kwargs,
    tokenizer identity, ...).

    Args:
        parts: JSON-like description; paths, sets and callables are canonicalised.

    Returns:
        64 hex characters.
    """
    payload = {
        "parts": dict(parts),
        "package_version": lightning_tune_data.__version__,
        "cache_format": CACHE_FORMAT_VERSION,
    }
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()


def file_identity(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Identify a data file cheaply: resolved path, size, mtime and a hash of its first/last MiB.

    Args:
        path: A regular file.

    Returns:
        ``{"path", "size", "mtime_ns", "head_tail_sha256"}``.

    Raises:
        FileNotFoundError: ``path`` does not exist or is not a regular file.
    """
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise FileNotFoundError(f"data file not found (or not a regular file): {resolved}")
    stat = resolved.stat()
    digest = hashlib.sha256()
    with open(resolved, "rb") as handle:
        digest.update(handle.read(_MIB))
        if stat.st_size > _MIB:
            handle.seek(max(stat.st_size - _MIB, _MIB))
            digest.update(handle.read(_MIB))
    return {
        "path": str(resolved),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "head_tail_sha256": digest.hexdigest(),
    }


def read_cache_metadata(cache_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Return the marker contents of a complete cache, or ``None`` if there is no valid marker."""
    marker = Path(cache_dir) / COMPLETE_MARKER
    try:
        with open(marker, encoding="utf-8") as handle:
            content = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(content, dict) or content.get("cache_format") != CACHE_FORMAT_VERSION:
        return None
    return content


def is_valid_cache(
    cache_dir: str | os.PathLike[str], metadata: Mapping[str, Any] | None = None
) -> bool:
    """Whether ``cache_dir`` is a finished cache (its completion marker exists and parses).

    Args:
        cache_dir: The cache directory.
        metadata: If given, the marker's metadata must also equal it (compared canonically).
    """
    if not Path(cache_dir).is_dir():
        return False
    content = read_cache_metadata(cache_dir)
    if content is None:
        return False
    if metadata is None:
        return True
    return canonical_json(content.get("metadata")) == canonical_json(dict(metadata))


def _fsync_path(path: Path) -> None:
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for filename in filenames:
            _fsync_path(Path(dirpath) / filename)
        _fsync_path(Path(dirpath))


def _temp_prefix(final_dir: Path) -> str:
    return f".{final_dir.name}.tmp-"


def build_cache_atomically(
    final_dir: str | os.PathLike[str],
    build: Callable[[Path], None],
    metadata: Mapping[str, Any],
    lock_timeout: float = -1,
    verify: Callable[[Path], str | None] | None = None,
) -> Path:
    """Return a valid cache at ``final_dir``, building it with ``build`` if needed.

    Under ``FileLock(<final_dir>.lock)``: if a valid cache with matching ``metadata`` exists it is
    returned untouched (``build`` is not called), unless ``verify`` reports it corrupt: then it is
    removed with a warning and rebuilt. Otherwise leftover temporary directories of
    killed builds are removed, an invalid ``final_dir`` is removed with a warning, ``build`` fills a
    fresh temporary directory beside ``final_dir``, the completion marker is written last, the tree
    is fsynced and renamed into place.

    Args:
        final_dir: Where the finished cache lives.
        build: Called with an empty temporary directory to fill.
        metadata: JSON-like metadata stored in the marker and required to match on reuse.
        lock_timeout: Seconds to wait for the lock (``-1``: forever).
        verify: Optional check of a complete cache's files: returns ``None`` when it is intact,
            else what is wrong (e.g. a truncated Arrow file).

    Returns:
        ``final_dir`` as a ``Path``.
    """
    final_dir = Path(final_dir)
    parent = final_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    metadata = dict(metadata)
    canonical_json(metadata)  # fail before building if the metadata cannot be serialised
    with FileLock(str(final_dir) + ".lock", timeout=lock_timeout):
        corrupt = None
        if is_valid_cache(final_dir, metadata):
            corrupt = verify(final_dir) if verify is not None else None
            if corrupt is None:
                log.info("Using cache %s", final_dir)
                return final_dir
        for stale in parent.glob(_temp_prefix(final_dir) + "*"):
            # We hold the lock, so no live process is building into these: they are leftovers
            # of a build that was killed.
            log.info("Removing leftover temporary cache %s of an interrupted build", stale)
            shutil.rmtree(stale, ignore_errors=True)
        if final_dir.exists() or final_dir.is_symlink():
            if corrupt is not None:
                reason = f"corrupt: {corrupt}"
            elif read_cache_metadata(final_dir) is not None:
                reason = "metadata mismatch: left by an incompatible build"
            else:
                reason = f"no valid {COMPLETE_MARKER} marker: left by an interrupted build"
            warnings.warn(f"Removing invalid cache {final_dir} ({reason}); rebuilding it.", stacklevel=2)
            if final_dir.is_dir() and not final_dir.is_symlink():
                shutil.rmtree(final_dir)
            else:
                final_dir.unlink()
        # Not tempfile.mkdtemp: it creates mode 0o700, and caches are shared like any directory.
        temp_dir = parent / f"{_temp_prefix(final_dir)}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        temp_dir.mkdir()
        try:
            build(temp_dir)
            marker = {
                "cache_format": CACHE_FORMAT_VERSION,
                "package_version": lightning_tune_data.__version__,
                "metadata": metadata,
            }
            _fsync_tree(temp_dir)
            marker_path = temp_dir / COMPLETE_MARKER
            with open(marker_path, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(marker, sort_keys=True, indent=2, default=_json_default))
                handle.flush()
                os.fsync(handle.fileno())
            _fsync_path(temp_dir)
            os.replace(temp_dir, final_dir)
            _fsync_path(parent)
        except BaseException:
            shutil.rmtree(temp_dir, ignore_errors=True)
            raise
    log.info("Wrote cache %s", final_dir)
    return final_dir
