"""Bounded retries of a ``datasets`` stream that fails with a network or I/O error.

``datasets`` retries a failing remote read itself (20 attempts 5 s apart by default, about 100 s
before an error surfaces) and does not retry an HTTP error status when a file is opened. A
streaming source turns the first off while it reads (:func:`without_datasets_read_retries`) and
re-opens the stream itself, bounded by its own :class:`RetryPolicy`: how many re-opens in a row,
how long to wait before each (doubled every time), and how long in all.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["MAX_BACKOFF_S", "Reopenings", "RetryPolicy", "is_transient", "stream_files",
           "without_datasets_read_retries"]

#: Longest wait between two attempts to re-open a failing stream.
MAX_BACKOFF_S = 60.0


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` (or an exception it was raised from) looks like a network/I-O failure.

    Args:
        error: the exception a stream raised.
    """
    aiohttp = sys.modules.get("aiohttp")
    kinds: tuple[type[BaseException], ...] = (OSError, TimeoutError)
    if aiohttp is not None:
        kinds += (aiohttp.ClientError,)
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, kinds):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


@contextlib.contextmanager
def without_datasets_read_retries() -> Iterator[None]:
    """Make ``datasets`` try each remote read once, so failures reach the caller's own bounded
    retry at once (its default is 20 attempts 5 s apart before an error surfaces)."""
    import datasets

    saved = datasets.config.STREAMING_READ_MAX_RETRIES
    datasets.config.STREAMING_READ_MAX_RETRIES = 1
    try:
        yield
    finally:
        datasets.config.STREAMING_READ_MAX_RETRIES = saved


def stream_files(dataset: Any, limit: int = 3) -> str:
    """The data files / URLs a ``datasets`` stream reads (best effort, for messages).

    Args:
        dataset: a ``datasets.IterableDataset``.
        limit: how many are named before the rest are counted.
    """
    files: list[str] = []
    pending = [getattr(dataset, "_ex_iterable", None)]
    while pending:
        node = pending.pop()
        if node is None:
            continue
        kwargs = getattr(node, "kwargs", None) or {}
        for key in ("original_files", "base_files", "files"):
            value = kwargs.get(key)
            if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
                files.extend(v for v in value if v not in files)
                break
        pending.append(getattr(node, "ex_iterable", None))
        pending.extend(getattr(node, "ex_iterables", None) or [])
    if not files:
        return "unknown files"
    shown = files[:limit] + ([f"... ({len(files)} files)"] if len(files) > limit else [])
    return ", ".join(shown)


class RetryPolicy:
    """How a source re-opens a stream that fails with a network or I/O error.

    Args:
        source: the source's name (for errors).
        max_retries: re-opens in a row before the error is raised (``0``: never).
        backoff_s: wait before the first re-open; doubled for each further one (at most
            :data:`MAX_BACKOFF_S`).
        timeout_s: the longest time spent retrying one failure (from the first failed read to the
            last re-open).

    Raises:
        ValueError: a negative value.
    """

    def __init__(self, source: str, max_retries: int, backoff_s: float, timeout_s: float) -> None:
        if max_retries < 0 or backoff_s < 0 or timeout_s < 0:
            raise ValueError(
                f"Source '{source}': max_retries, retry_backoff_s and retry_timeout_s must be >= 0, got "
                f"{max_retries}, {backoff_s} and {timeout_s}."
            )
        self.source = source
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.timeout_s = float(timeout_s)


class Reopenings:
    """The re-opens of one read of a stream since it last read a row, under a :class:`RetryPolicy`.

    The reader sets :attr:`count` back to 0 after every successful read.

    Args:
        policy: the source's policy.
    """

    __slots__ = ("policy", "count", "first_failure_at")

    def __init__(self, policy: RetryPolicy) -> None:
        self.policy = policy
        self.count = 0
        self.first_failure_at = 0.0

    def delay_after(self, error: Exception, files: str, where: str) -> float:
        """The wait before re-opening after ``error``, counted as one more re-open.

        Args:
            error: what the stream raised.
            files: the stream's files (for the errors).
            where: the row and pass that failed (``"row 30 of pass 0"``).

        Raises:
            RuntimeError: the error is not a network/I-O failure (it ends the stream), or the
                policy is used up.
        """
        policy, source = self.policy, self.policy.source
        if not is_transient(error):
            raise RuntimeError(
                f"Source '{source}': the datasets stream ({files}) failed at {where} ({type(error).__name__}: "
                f"{error}). Errors inside the stream (e.g. the preprocess .map) end it and cannot be skipped; fix "
                "the preprocess function."
            ) from error
        now = time.monotonic()
        self.first_failure_at = now if self.count == 0 else self.first_failure_at
        delay = min(policy.backoff_s * 2**self.count, MAX_BACKOFF_S)
        out_of_time = now + delay - self.first_failure_at > policy.timeout_s
        if self.count >= policy.max_retries or out_of_time:
            limit = (f"retry_timeout_s={policy.timeout_s:g} would be exceeded" if out_of_time
                     and self.count < policy.max_retries else f"max_retries={policy.max_retries}")
            raise RuntimeError(
                f"Source '{source}': reading the stream from {files} failed at {where} with "
                f"{type(error).__name__}: {error}, and kept failing after {self.count} re-opens with backoff "
                f"({limit}) over {now - self.first_failure_at:.1f}s. Check the server/network and the URL, or "
                "raise max_retries / retry_backoff_s / retry_timeout_s."
            ) from error
        self.count += 1
        return delay
