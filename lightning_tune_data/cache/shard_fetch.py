"""Fetching one file of a remote store into a local file: in ranges, retried, verified (the one
download-and-verify path: the node's shard cache and whole copies of a store both use it).

A shard is read in ranges of :data:`RANGE_BYTES`; a range that fails with a network error (a
dropped connection, a 5xx the filesystem gives up on) is read again after a backoff that doubles
each time, up to ``max_retries`` in a row, and the download goes on from that range, not from the
start. The bytes are hashed as they arrive; a short or damaged shard (its size or checksum is not
what the store's commit records) is fetched once more from the start, then named. A full local
disk says so, with the folder and what to do.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import xxhash

from lightning_tune_data.cache.checksums import CHECKSUM_ALGORITHM
from lightning_tune_data.cache.root import StorageError
from lightning_tune_data.cache.sizes import human_size
from lightning_tune_data.cache.store_files import StoreFiles

__all__ = ["RANGE_BYTES", "FetchRetries", "LocalDiskFullError", "ShardCorruptError", "fetch_shard", "stored_checksum"]

#: Bytes read from storage per request.
RANGE_BYTES = 16 << 20


class ShardCorruptError(OSError):
    """A shard in storage does not match the size or checksum its store's commit records."""


class LocalDiskFullError(OSError):
    """The node's disk has no room for a shard being downloaded."""


@dataclass(frozen=True)
class FetchRetries:
    """How a failing read of a shard is retried.

    Args:
        max_retries: reads of one range retried in a row before the download fails.
        backoff_s: wait before the first retry, doubled for each further one.
        max_backoff_s: the longest wait between two tries.
    """

    max_retries: int = 5
    backoff_s: float = 0.5
    max_backoff_s: float = 30.0

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError(f"fetch retries must be >= 0, got {self}.")


def _read_range(files: StoreFiles, relative: str, start: int, end: int) -> bytes:
    if files.fs is None:
        with open(files.path(relative), "rb") as handle:
            handle.seek(start)
            return handle.read(end - start)
    return files.fs.cat_file(files.path(relative), start=start, end=end)


def _disk_full(target: Path, size: int) -> LocalDiskFullError:
    try:
        free = human_size(os.statvfs(target.parent).f_bavail * os.statvfs(target.parent).f_frsize)
    except OSError:
        free = "unknown"
    return LocalDiskFullError(
        errno.ENOSPC,
        f"The local cache disk is full: no room for a {human_size(size)} shard in {target.parent} ({free} free). "
        "Free space there, lower cache_budget, or point local_cache_dir at a larger disk.",
    )


def _download(files: StoreFiles, relative: str, size: int, target: Path, retries: FetchRetries,
              on_bytes: Callable[[int], None] | None) -> tuple[int, str]:
    """Write the shard's bytes to ``target``; its size and checksum as they arrived."""
    try:
        return _write_ranges(files, relative, size, target, retries, on_bytes)
    except OSError as error:
        # Anywhere in the write, the final flush, or closing the file: a write buffered by
        # ``open`` fails only when it is flushed, which may be on close.
        if error.errno == errno.ENOSPC and not isinstance(error, LocalDiskFullError):
            raise _disk_full(target, size) from None
        raise


def _chunks(files: StoreFiles, relative: str, size: int, retries: FetchRetries) -> Iterator[bytes]:
    """The file's bytes, range by range, each range retried with backoff; stops early when the
    storage has fewer bytes than ``size``."""
    written = 0
    while written < size or written == 0:
        start = written
        end = min(start + RANGE_BYTES, size) if size else RANGE_BYTES
        failures = 0
        while True:
            try:
                chunk = _read_range(files, relative, start, end)
                break
            except FileNotFoundError:
                raise StorageError(f"{files.url(relative)} is missing from the store; the store in storage is "
                                   "incomplete. Prepare it again.") from None
            except Exception as error:  # noqa: BLE001 - s3fs/aiohttp/botocore errors have no common base
                if failures >= retries.max_retries:
                    raise StorageError(
                        f"Downloading {files.url(relative)} failed at byte {written} of {size} "
                        f"({type(error).__name__}: {str(error).strip()[:200]}) after {failures} retries with backoff. "
                        "Check the network and the storage, or raise the retries."
                    ) from error
                time.sleep(min(retries.backoff_s * 2**failures, retries.max_backoff_s))
                failures += 1
        if not chunk:
            return
        yield chunk
        written += len(chunk)
        if len(chunk) < end - start:  # the storage has fewer bytes than recorded
            return


def _write_ranges(files: StoreFiles, relative: str, size: int, target: Path, retries: FetchRetries,
                  on_bytes: Callable[[int], None] | None) -> tuple[int, str]:
    digest = xxhash.xxh3_128()
    written = 0
    with open(target, "wb") as handle:
        for chunk in _chunks(files, relative, size, retries):
            handle.write(chunk)
            digest.update(chunk)
            written += len(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
        handle.flush()
        os.fsync(handle.fileno())
    return written, digest.hexdigest()


def stored_checksum(files: StoreFiles, relative: str, size: int, retries: FetchRetries = FetchRetries()) -> str | None:
    """The checksum of the ``size`` bytes file ``relative`` has in storage (read, not written
    anywhere); ``None`` when it is missing or has another size.

    Args:
        files: the store.
        relative: the file's path in it.
        size: the size it must have.
        retries: how failing reads are retried.
    """
    if files.size(relative) != size:
        return None
    digest, read = xxhash.xxh3_128(), 0
    for chunk in _chunks(files, relative, size, retries):
        digest.update(chunk)
        read += len(chunk)
    return digest.hexdigest() if read == size else None


def fetch_shard(files: StoreFiles, relative: str, expected: dict, target: Path, retries: FetchRetries = FetchRetries(),
                on_bytes: Callable[[int], None] | None = None) -> None:
    """Download file ``relative`` of ``files`` (a shard, or any file a commit records) to
    ``target`` and check it against ``expected``.

    Args:
        files: the remote store.
        relative: the shard's path in the store.
        expected: its entry in the commit's files (``size`` and checksum).
        target: the local file to write (its folder exists); left behind only when verified.
        retries: how failing reads are retried.
        on_bytes: called with the number of bytes of every range that arrives (progress).

    Raises:
        StorageError: reads kept failing, or the shard is missing.
        ShardCorruptError: the shard arrived short or damaged twice.
        LocalDiskFullError: the local disk filled up.
    """
    size, want = int(expected.get("size", 0)), expected.get(CHECKSUM_ALGORITHM)
    problem = ""
    try:
        for _ in range(2):  # a short or damaged transfer is fetched once more before it is named
            got_size, got = _download(files, relative, size, target, retries, on_bytes)
            if got_size != size:
                problem = f"{got_size} bytes arrived, {size} were written"
            elif want and got != want:
                problem = f"{CHECKSUM_ALGORITHM} {got} != {want} recorded when it was written"
            else:
                return
        raise ShardCorruptError(
            f"{files.url(relative)} is corrupt ({problem}), twice: its bytes in storage changed after they were "
            f"written, or the transfer is damaged. Repair the store (lightning-tune-data prepare --config <config> "
            f"--repair redoes only the task that wrote it), or remove this one store (lightning-tune-data cache clean "
            f"--cache-dir {files.root.url} --store {files.name}) and prepare it again."
        )
    except BaseException:
        target.unlink(missing_ok=True)
        raise
