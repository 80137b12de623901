"""Atomic cache builds: crash-safe, lock-guarded writes of a cache folder.

A cache directory is *valid* only when it holds the completion marker ``_COMPLETE.json`` whose
metadata matches what the reader expects (:mod:`lightning_tune_data.cache.marker`). Caches are built in a temporary directory beside the
final one, the checksum of every file is recorded in the marker, the marker is written last,
everything is fsynced, and the directory is renamed into place, all under a file lock
(``<final_dir>.lock``). A process killed at any point therefore leaves either nothing, or a
temporary directory that is never read and is removed by the next build, or a complete cache.

Reusing a complete cache needs no lock and no write access: its files are checked against the
recorded checksums (or sizes only, see :mod:`lightning_tune_data.cache.checksums`) and it is read
as it is, so caches on a read-only volume work. Only a build takes the lock; a build in a
directory that cannot be written fails with :class:`CacheReadOnlyError`.
"""

from __future__ import annotations

import errno
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

from lightning_tune_data.cache.checksums import VERIFY_MODES, VerifyMode, tree_checksums, verify_files
from lightning_tune_data.cache.fingerprints import canonical_json, json_default
from lightning_tune_data.cache.layout import lock_path, temporary_prefix
from lightning_tune_data.cache.marker import COMPLETE_MARKER, is_valid_cache, marker_content, read_cache_metadata
from lightning_tune_data.cache.sizes import human_size, tree_size
from lightning_tune_data.cache.verified import record_verified

__all__ = ["CacheReadOnlyError", "build_cache_atomically", "check_complete_cache"]

log = logging.getLogger(__name__)
# Cache hits and builds are one line each and must show at the default log level (Python's
# default is WARNING): like Lightning's own logger, print INFO ourselves unless the
# application configured logging (then its handlers and levels decide).
log.setLevel(logging.INFO)
if not logging.getLogger().hasHandlers():
    _handler = logging.StreamHandler()
    _handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(_handler)
    log.propagate = False


class CacheReadOnlyError(PermissionError):
    """A cache must be built but its directory cannot be written; the message names the
    directory and the ``cache_dir`` option."""


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


def check_complete_cache(
    cache_dir: str | os.PathLike[str],
    verify: Callable[[Path], str | None] | None = None,
    verify_mode: VerifyMode = "checksum",
) -> str | None:
    """What is wrong with a complete cache's files (``None``: intact), without writing anything.

    Args:
        cache_dir: A directory whose marker is valid.
        verify: Extra check of the content (e.g. that the dataset opens).
        verify_mode: ``"checksum"`` hashes every file against the recorded checksums,
            ``"size"`` compares sizes only.
    """
    content = read_cache_metadata(cache_dir) or {}
    problem = verify_files(cache_dir, content.get("files") or {}, verify_mode)
    if problem is None and verify is not None:
        problem = verify(Path(cache_dir))
    return problem


def _not_writable(error: OSError) -> bool:
    return isinstance(error, PermissionError) or error.errno in (errno.EROFS, errno.EACCES, errno.EPERM)


def _read_only_error(parent: Path, final_dir: Path, why: str, description: str, error: OSError) -> CacheReadOnlyError:
    return CacheReadOnlyError(
        f"{description}: the cache {final_dir.name} must be built ({why}) but the cache directory {parent} "
        f"cannot be written ({type(error).__name__}: {error}). A complete cache there is used read-only; this one "
        f"has to be built first. Set the cache_dir option (TextDataModule(cache_dir=...), data.cache_dir in a "
        f"config, or $LIGHTNING_TUNE_DATA_CACHE) to a writable directory, or build the cache once where it can "
        f"be written and copy it to {parent}."
    )


def _prepare_lock(parent: Path, final_dir: Path, why: str, description: str) -> str:
    """Create the cache root and the lock file, turning 'cannot write here' into a clear error."""
    lock = str(lock_path(final_dir))
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        os.close(fd)
    except OSError as error:
        if _not_writable(error):
            raise _read_only_error(parent, final_dir, why, description, error) from error
        raise
    return lock


def build_cache_atomically(
    final_dir: str | os.PathLike[str],
    build: Callable[[Path], None],
    metadata: Mapping[str, Any],
    lock_timeout: float = -1,
    verify: Callable[[Path], str | None] | None = None,
    verify_mode: VerifyMode = "checksum",
    inputs: Mapping[str, Any] | None = None,
    description: str = "cache",
    build_reason: Callable[[], str] | None = None,
    describe: Callable[[Path], tuple[dict[str, Any], dict[str, Any] | None]] | None = None,
) -> Path:
    """Return a valid cache at ``final_dir``, building it with ``build`` if needed.

    A complete cache with matching ``metadata`` whose files pass the check (``verify_mode``:
    the checksums recorded at write time, or sizes only; then ``verify``) is returned untouched,
    without taking the lock or writing anything (read-only volumes work). Otherwise, under
    ``FileLock(<final_dir>.lock)``: the check is repeated (another process may have just built
    it), leftover temporary directories of killed builds are removed, an invalid or corrupt
    ``final_dir`` is removed with a warning naming the problem (e.g. the corrupt file),
    ``build`` fills a fresh temporary directory beside ``final_dir``, the checksum of every file
    and the marker are written last, the tree is fsynced and renamed into place.

    Args:
        final_dir: Where the finished cache lives.
        build: Called with an empty temporary directory to fill.
        metadata: JSON-like metadata stored in the marker and required to match on reuse.
        lock_timeout: Seconds to wait for the lock (``-1``: forever).
        verify: Optional check of a complete cache's content: returns ``None`` when it is
            intact, else what is wrong (e.g. the dataset does not open).
        verify_mode: ``"checksum"`` (default) or ``"size"``, see :mod:`lightning_tune_data.cache.checksums`.
        inputs: JSON-like description of what the cache was built from, stored in the marker
            (so later builds can say what changed, and ``cache list`` what is stale).
        description: Names the cache in messages (e.g. ``source 'notes' (...)``).
        build_reason: Called before a build; returns why it is needed (for the log line).
        describe: Called with the filled folder; returns the checksums of its files (already
            computed while writing) and the token store's shards for the marker. Default: every
            file is hashed and there is no store section.

    Returns:
        ``final_dir`` as a ``Path``.

    Raises:
        CacheReadOnlyError: A build is needed but the cache directory cannot be written.
    """
    if verify_mode not in VERIFY_MODES:
        raise ValueError(f"cache verification mode {verify_mode!r} is not one of {VERIFY_MODES}.")
    final_dir = Path(final_dir)
    parent = final_dir.parent
    metadata = dict(metadata)
    canonical_json(metadata)  # fail before building if the metadata cannot be serialised
    corrupt = None
    if is_valid_cache(final_dir, metadata):
        corrupt = check_complete_cache(final_dir, verify, verify_mode)
        if corrupt is None:
            log.info("%s: using cache %s (%s, %s checked)", description, final_dir,
                     human_size(tree_size(final_dir)), "checksums" if verify_mode == "checksum" else "sizes")
            return final_dir
    why = f"corrupt: {corrupt}" if corrupt else "no complete cache for this configuration"
    lock = _prepare_lock(parent, final_dir, why, description)
    with FileLock(lock, timeout=lock_timeout):
        if is_valid_cache(final_dir, metadata):  # built (or repaired) meanwhile by another process?
            corrupt = check_complete_cache(final_dir, verify, verify_mode)
            if corrupt is None:
                log.info("%s: using cache %s (built by another process)", description, final_dir)
                return final_dir
        for stale in parent.glob(temporary_prefix(final_dir) + "*"):
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
            reason_line = f"the previous build was invalid ({reason})"
        else:
            reason_line = build_reason() if build_reason is not None else "no cache for this configuration yet"
        # Not tempfile.mkdtemp: it creates mode 0o700, and caches are shared like any directory.
        temp_dir = parent / f"{temporary_prefix(final_dir)}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        temp_dir.mkdir()
        try:
            build(temp_dir)
            files, store = describe(temp_dir) if describe is not None else (
                tree_checksums(temp_dir, exclude=[COMPLETE_MARKER]), None)
            marker = marker_content(metadata, inputs or {}, description, files, store)
            _fsync_tree(temp_dir)
            marker_path = temp_dir / COMPLETE_MARKER
            with open(marker_path, "w", encoding="utf-8") as handle:
                handle.write(json.dumps(marker, sort_keys=True, indent=2, default=json_default))
                handle.flush()
                os.fsync(handle.fileno())
            _fsync_path(temp_dir)
            os.replace(temp_dir, final_dir)
            _fsync_path(parent)
        except BaseException:
            shutil.rmtree(temp_dir, ignore_errors=True)
            raise
        record_verified(final_dir, files)  # just hashed: the next open checks stamps only
    log.info("%s: built cache %s (%s) because %s", description, final_dir, human_size(tree_size(final_dir)),
             reason_line)
    return final_dir
