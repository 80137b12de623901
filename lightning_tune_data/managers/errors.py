"""The errors of a source: misconfigured or unreadable data, and a cache that was never built."""

from __future__ import annotations

__all__ = ["CacheMissingError", "DataSourceError", "error_causes"]


class DataSourceError(ValueError):
    """A source is misconfigured or its data cannot be loaded; the message names source and fix."""


class CacheMissingError(FileNotFoundError):
    """``setup`` found no valid cache: ``prepare_data`` has not run for this configuration."""


def error_causes(error: BaseException, limit: int = 4) -> str:
    """`` (caused by A: ...; B: ...)`` from an exception's chain (the root cause names the problem).

    Args:
        error: The exception whose ``__cause__``/``__context__`` chain is described.
        limit: At most this many causes are listed.
    """
    parts: list[str] = []
    cause = error.__cause__ or error.__context__
    while cause is not None and len(parts) < limit:
        text = " ".join(str(cause).split())[:300]
        parts.append(f"{type(cause).__name__}: {text}" if text else type(cause).__name__)
        cause = cause.__cause__ or cause.__context__
    return f" (caused by {'; '.join(parts)})" if parts else ""
