"""What every manager shares: the stages it can serve, its errors, and naming helpers."""

from __future__ import annotations

import re
from collections.abc import Sequence

#: Trainer stages a manager can take part in.
STAGES = ("fit", "validate", "test", "predict")
#: Columns a preprocessed cache keeps.
DEFAULT_PREPROCESS = "lightning_tune_data.preprocess.tokenize_text"
CACHE_MANIFEST = "_manifest.json"


class DataSourceError(ValueError):
    """A source is misconfigured or its data cannot be loaded; the message names source and fix."""


class CacheMissingError(FileNotFoundError):
    """``setup`` found no valid cache: ``prepare_data`` has not run for this configuration."""


def _validate_stages(stages: Sequence[str] | None, owner: str) -> list[str]:
    if stages is None:
        return list(STAGES)
    if isinstance(stages, str):
        stages = [stages]
    bad = [s for s in stages if s not in STAGES]
    if bad or not stages:
        raise DataSourceError(
            f"{owner}: stages {list(stages)!r} invalid: {bad or 'empty list'}; each stage must be "
            f"one of {list(STAGES)} (or leave stages unset for all of them)."
        )
    return list(dict.fromkeys(stages))


def _causes(error: BaseException, limit: int = 4) -> str:
    """`` (caused by A: ...; B: ...)`` from an exception's chain (the root cause names the problem)."""
    parts: list[str] = []
    cause = error.__cause__ or error.__context__
    while cause is not None and len(parts) < limit:
        text = " ".join(str(cause).split())[:300]
        parts.append(f"{type(cause).__name__}: {text}" if text else type(cause).__name__)
        cause = cause.__cause__ or cause.__context__
    return f" (caused by {'; '.join(parts)})" if parts else ""


def _safe_name(text: str, limit: int = 80) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._-")[:limit] or "source"
