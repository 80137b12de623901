"""Many small remote reads at once (index files, headers), each of the bytes recorded at open.

Opening a corpus of 10,000 files fetches 10,000 small files: the cost is the number of requests
and how many are in flight, not bytes. :func:`read_checked` runs them concurrently, at most
:data:`CONCURRENT_REQUESTS` at a time. On S3 each is one GET made conditional on the ETag the
listing recorded (``If-Match``): a file replaced since the corpus was opened answers "precondition
failed" instead of other bytes, so no request is spent checking. Elsewhere the reads are plain,
and the caller checks the files' identities after (one listing).
"""

from __future__ import annotations

import asyncio
import errno
import re
from typing import Any

__all__ = ["CONCURRENT_REQUESTS", "ChangedFile", "pooled_options", "read_checked"]

#: Requests in flight at once when many small files are read at open.
CONCURRENT_REQUESTS = 64

_ETAG = re.compile(r"^[0-9a-fA-F]{16,}(-[0-9]+)?$")  # an MD5 (with a multipart upload's part count)


class ChangedFile(Exception):
    """A file whose identity is no longer the one recorded (its name is the argument)."""


def pooled_options(protocol: str, storage_options: dict[str, Any]) -> dict[str, Any]:
    """``storage_options`` with room for :data:`CONCURRENT_REQUESTS` connections on S3 (botocore
    keeps 10 by default, which would cap the requests in flight), unless the user chose a pool.

    Args:
        protocol: the URL's protocol (``s3``, ``gs``, ...).
        storage_options: the filesystem's options.
    """
    if protocol not in ("s3", "s3a"):
        return storage_options
    config = dict(storage_options.get("config_kwargs") or {})
    config.setdefault("max_pool_connections", CONCURRENT_REQUESTS)
    return {**storage_options, "config_kwargs": config}


def read_checked(fs: Any, reads: list[tuple[str, int | None, int | None, str]]) -> tuple[list[bytes], bool]:
    """The bytes of every read ``(path, start, end, stamp)`` (``start``/``end`` ``None``: the whole
    file), concurrently; and whether each was checked against its ``stamp`` on the way.

    Args:
        fs: the files' filesystem.
        reads: what to read, with the identity (ETag) each file had at open.

    Raises:
        ChangedFile: (checked reads only) a file whose ETag is no longer its ``stamp``.
    """
    if not reads:
        return [], True
    s3 = "s3" in (getattr(fs, "protocol", None) or ()) and hasattr(fs, "_call_s3")
    if s3 and all(_ETAG.match(stamp) for _, _, _, stamp in reads):  # an S3-compatible store that lists ETags
        from fsspec.asyn import sync

        return sync(fs.loop, _conditional_gets, fs, reads), True
    if all(start is None for _, start, _, _ in reads):
        found = fs.cat([path for path, _, _, _ in reads], on_error="raise", batch_size=CONCURRENT_REQUESTS)
        return [found[path] for path, _, _, _ in reads], False
    paths = [path for path, _, _, _ in reads]
    starts = [start or 0 for _, start, _, _ in reads]
    return fs.cat_ranges(paths, starts, [end for _, _, end, _ in reads], on_error="raise",
                         batch_size=CONCURRENT_REQUESTS), False


async def _conditional_gets(fs: Any, reads: list[tuple[str, int | None, int | None, str]]) -> list[bytes]:
    """One GET per read, ``If-Match`` its recorded ETag, at most :data:`CONCURRENT_REQUESTS` at once."""
    slots = asyncio.Semaphore(CONCURRENT_REQUESTS)

    async def get(path: str, start: int | None, end: int | None, stamp: str) -> bytes:
        if start is not None and end is not None and end <= start:
            return b""
        bucket, key, _ = fs.split_path(path)
        extra = {"IfMatch": f'"{stamp}"'}
        if start is not None:
            extra["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        async with slots:
            try:
                response = await fs._call_s3("get_object", Bucket=bucket, Key=key, **extra)
            except OSError as error:
                if error.errno == errno.EINVAL and ("condition" in str(error) or "412" in str(error)):
                    raise ChangedFile(path) from None
                raise
            try:
                return await response["Body"].read()
            finally:
                response["Body"].close()

    return list(await asyncio.gather(*(get(*read) for read in reads)))
