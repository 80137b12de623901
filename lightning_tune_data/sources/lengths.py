"""Document lengths and training targets of a cached source, read from its Arrow columns.

A cached source stores ``input_ids`` as an Arrow list column: its offsets buffer already holds
every document's length, so the lengths of millions of documents cost one pass over one integer
array. ``TextDataModule.setup`` uses this to warn, once per source, when many documents are longer
than ``max_seq_len``; the data report uses it for its length histograms. For a masked source
(``loss_mask``: prompt/completion data) one vectorised pass over the mask's values finds the
documents that truncation leaves with no target token (:func:`no_target_summary`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from lightning_tune_data.keys import INPUT_IDS, LOSS_MASK, OverlongPolicy
from lightning_tune_data.sources.arrow_columns import is_view_type

__all__ = [
    "NoTargetSummary",
    "OverlongSummary",
    "document_lengths",
    "no_target_summary",
    "overlong_summary",
    "overlong_warnings",
]

#: Share of a source's documents above which ``setup`` warns.
OVERLONG_WARNING_SHARE = 0.01


#: Rows of a masked column read at once by :func:`no_target_summary` (bounds its memory).
_ROWS_PER_READ = 1 << 16


def _arrow_table(dataset: Any) -> pa.Table | None:
    """The pyarrow table behind a cached ``datasets.Dataset`` (``None`` for anything else)."""
    table = getattr(dataset, "data", None)
    table = getattr(table, "table", table)  # datasets wraps the pyarrow table
    return table if isinstance(table, pa.Table) else None


def _in_row_order(dataset: Any, values: np.ndarray) -> np.ndarray:
    """Per-table-row ``values`` in the dataset's row order (after any ``select``/``shuffle``)."""
    indices = getattr(dataset, "_indices", None)
    if indices is not None:  # a select/shuffle view: map its rows onto the table's rows
        values = values[indices.column(0).to_numpy()]
    return values


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
    table = _arrow_table(dataset)
    if table is None or column not in table.column_names:
        raise ValueError(
            f"document_lengths: expected a cached datasets.Dataset with a '{column}' column, got "
            f"{type(dataset).__name__}."
        )
    parts = []
    for chunk in table.column(column).chunks:
        if is_view_type(chunk.type):  # rows apart in the values
            parts.append(chunk.sizes.to_numpy(zero_copy_only=False).astype(np.int64, copy=False))
            continue
        if not isinstance(chunk, (pa.ListArray, pa.LargeListArray)):
            raise ValueError(f"document_lengths: column '{column}' holds {chunk.type}, not lists of token ids.")
        parts.append(np.diff(chunk.offsets.to_numpy(zero_copy_only=False)).astype(np.int64, copy=False))
    return _in_row_order(dataset, np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))


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
            table = _arrow_table(dataset)
            # concat would keep every token, but it packs a masked document's prompt and completion into
            # different rows: no advice to use it for prompt/completion data
            fix = ("Raise max_seq_len or shorten the documents (their prompts)."
                   if table is not None and LOSS_MASK in table.column_names
                   else "Raise max_seq_len, or use packing='concat' to keep every token.")
            lines.append(
                f"Train source '{source}': {summary.overlong:,} of {summary.documents:,} documents "
                f"({100 * summary.share:.1f}%) are longer than max_seq_len={max_seq_len} and will be {action} "
                f"(overlong='{overlong}'). {fix}"
            )
    return lines


@dataclass(frozen=True)
class NoTargetSummary:
    """How many of a masked source's documents are left with no target token.

    Attributes:
        source: the source's name.
        documents: documents the source hands out (empty ones and, with ``overlong="drop"``,
            documents longer than ``max_seq_len`` are left out: they never reach the model).
        no_target: of those, documents with no target label once cut to ``max_seq_len``: no token
            after the first has ``loss_mask`` true (the first token is never predicted), so they
            add nothing to the loss.
        max_seq_len: the length they are cut to (``None``: not cut).
    """

    source: str
    documents: int
    no_target: int
    max_seq_len: int | None

    @property
    def share(self) -> float:
        """The target-free documents' share of the documents handed out (0 for an empty source)."""
        return self.no_target / self.documents if self.documents else 0.0


def no_target_summary(source: str, dataset: Any, max_seq_len: int | None,
                      overlong: OverlongPolicy = "truncate") -> NoTargetSummary | None:
    """Count the documents of a masked source that keep no target token within ``max_seq_len``.

    One vectorised pass over the ``loss_mask`` column's values, a block of rows at a time: the
    documents' target windows ``[1, min(length, max_seq_len))`` are reduced with one
    ``logical_or.reduceat`` per block (no Python loop over rows).

    Args:
        source: the source's name (kept in the summary).
        dataset: a cached ``datasets.Dataset``.
        max_seq_len: the length documents are cut to; ``None`` when they are handed out whole
            (a packing strategy that splits documents).
        overlong: ``"truncate"`` (longer documents are cut) or ``"drop"`` (they are skipped).

    Returns:
        The summary, or ``None`` when the dataset has no ``loss_mask`` list column (every token
        is a target) or is not a cached Arrow dataset.
    """
    table = _arrow_table(dataset)
    if table is None or LOSS_MASK not in table.column_names:
        return None
    handed_out, no_target = [], []
    for chunk in table.column(LOSS_MASK).chunks:
        if not isinstance(chunk, (pa.ListArray, pa.LargeListArray)):
            return None
        offsets = chunk.offsets.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        for first in range(0, len(chunk), _ROWS_PER_READ):
            bounds = offsets[first : first + _ROWS_PER_READ + 1]
            lengths = np.diff(bounds)
            kept = lengths > 0
            if max_seq_len is not None and overlong == "drop":
                kept &= lengths <= max_seq_len
            window = lengths if max_seq_len is None else np.minimum(lengths, max_seq_len)
            mask = chunk.values.slice(int(bounds[0]), int(bounds[-1] - bounds[0])).to_numpy(zero_copy_only=False)
            mask = np.append(mask.astype(bool, copy=False), False)  # reduceat may index one past the last value
            starts = bounds[:-1] - bounds[0]
            has_window = window > 1
            edges = np.minimum(np.stack([starts + 1, starts + np.maximum(window, 1)], axis=1).reshape(-1), len(mask) - 1)
            targets = np.logical_or.reduceat(mask, edges)[::2] & has_window if len(edges) else has_window
            handed_out.append(kept)
            no_target.append(kept & ~targets)
    kept_rows = _in_row_order(dataset, np.concatenate(handed_out) if handed_out else np.zeros(0, dtype=bool))
    empty = _in_row_order(dataset, np.concatenate(no_target) if no_target else np.zeros(0, dtype=bool))
    return NoTargetSummary(source, int(np.count_nonzero(kept_rows)), int(np.count_nonzero(empty)),
                           None if max_seq_len is None else int(max_seq_len))
