"""Document lengths of a cached source, read from the Arrow offsets (no token is read).

A cached source stores ``input_ids`` as an Arrow list column: its offsets buffer already holds
every document's length, so the lengths of millions of documents cost one pass over one integer
array. ``TextDataModule.setup`` uses this to warn, once per source, when many documents are longer
than ``max_seq_len``; the data report uses it for its length histograms.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from lightning_tune_data.keys import INPUT_IDS, OverlongPolicy

__all__ = ["OverlongSummary", "document_lengths", "overlong_summary", "overlong_warnings"]

#: Share of a source's documents above which ``setup`` warns.
OVERLONG_WARNING_SHARE = 0.01


def document_lengths(dataset: Any, column: str = INPUT_IDS) -> np.ndarray:
    """Token count of every document of a cached ``datasets.Dataset``, in row order.

    Args:
        dataset: a ``datasets.Dataset`` (memory-mapped cache) with a list column ``column``.
        column: the token column.

    Returns:
        A 1-D ``int64`` array with one length per row (after any ``select``/``shuffle`` index mapping).

    Raises:
        ValueError: the dataset has no such list column.
    """
    table = getattr(dataset, "data", None)
    table = getattr(table, "table", table)  # datasets wraps the pyarrow table
    if not isinstance(table, pa.Table) or column not in table.column_names:
        raise ValueError(
            f"document_lengths: expected a cached datasets.Dataset with a '{column}' column, got "
            f"{type(dataset).__name__}."
        )
    parts = []
    for chunk in table.column(column).chunks:
        if not isinstance(chunk, (pa.ListArray, pa.LargeListArray)):
            raise ValueError(f"document_lengths: column '{column}' holds {chunk.type}, not lists of token ids.")
        parts.append(np.diff(chunk.offsets.to_numpy(zero_copy_only=False)).astype(np.int64, copy=False))
    lengths = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    indices = getattr(dataset, "_indices", None)
    if indices is not None:  # a select/shuffle view: map its rows onto the table's rows
        lengths = lengths[indices.column(0).to_numpy()]
    return lengths


@dataclass(frozen=True)
class OverlongSummary:
    """How many of a source's documents exceed ``max_seq_len``."""

    source: str
    documents: int
    overlong: int
    max_seq_len: int

    @property
    def share(self) -> float:
        """The overlong documents' share of all documents (0 for an empty source)."""
        return self.overlong / self.documents if self.documents else 0.0


def overlong_summary(source: str, dataset: Any, max_seq_len: int) -> OverlongSummary:
    """Count the documents of ``dataset`` longer than ``max_seq_len`` (from the offsets only).

    Args:
        source: the source's name (kept in the summary).
        dataset: a cached ``datasets.Dataset``.
        max_seq_len: the length limit.
    """
    lengths = document_lengths(dataset)
    return OverlongSummary(source, int(lengths.size), int((lengths > max_seq_len).sum()), int(max_seq_len))


def overlong_warnings(datasets: Mapping[str, Any], max_seq_len: int, overlong: OverlongPolicy,
                      threshold: float = OVERLONG_WARNING_SHARE) -> list[str]:
    """One warning line per source where more than ``threshold`` of the documents exceed ``max_seq_len``.

    Sources that are not cached Arrow datasets (e.g. streaming ones) are skipped.

    Args:
        datasets: source name -> loaded dataset.
        max_seq_len: the longest sequence a batch row holds.
        overlong: the datamodule's policy, ``"truncate"`` or ``"drop"`` (named in the message).
        threshold: share of documents above which a source is reported.
    """
    action = "cut to their first max_seq_len tokens" if overlong == "truncate" else "dropped"
    lines = []
    for source, dataset in datasets.items():
        try:
            summary = overlong_summary(source, dataset, max_seq_len)
        except ValueError:
            continue
        if summary.share > threshold:
            lines.append(
                f"Train source '{source}': {summary.overlong:,} of {summary.documents:,} documents "
                f"({100 * summary.share:.1f}%) are longer than max_seq_len={max_seq_len} and will be {action} "
                f"(overlong='{overlong}'). Raise max_seq_len, or use packing='concat' to keep every token."
            )
    return lines
