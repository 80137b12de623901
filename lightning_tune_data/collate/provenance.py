"""The provenance side channel of packed batches: per-document facts, flattened over rows, and
how many labels of each piece are targets.

The side channel itself is described in :mod:`lightning_tune_data.collate`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lightning_tune_data.keys import (
    DROPPED_BEFORE,
    EPOCH,
    IGNORE_INDEX,
    NEW_DOCUMENT,
    PAD_DOCUMENT_ID,
    ROW,
    SOURCE,
    TARGET_TOKENS,
    TOKENS,
    TRUNCATED_TOKENS,
)
from lightning_tune_data.packing.pack import Pack
from lightning_tune_data.packing.rows import integer_bounds

__all__ = ["packed_provenance", "piece_targets", "segment_targets"]


def segment_targets(labels: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """How many labels of each segment of ``labels`` are targets (not ``-100``), in one reduction.

    Args:
        labels: 1-D labels (a batch's, flattened, or one pack's).
        starts: first position of each segment, increasing from 0; a segment runs to the next
            start (the last one to the end). Only non-empty segments get a meaningful count.
    """
    targets = (labels != IGNORE_INDEX).view(np.uint8)
    inside = int(np.searchsorted(starts, labels.shape[0]))  # empty segments at the very end start past it
    counts = np.zeros(starts.shape[0], dtype=np.int32)
    counts[:inside] = np.add.reduceat(targets, starts[:inside], dtype=np.int32)
    return counts


def packed_provenance(rows: Sequence[Sequence[Mapping[str, Any]]],
                      target_tokens: Sequence[int] | None = None) -> dict[str, list[Any]]:
    """The per-document provenance of packed rows as one dict of lists, flattened over rows.

    Every key found in any document's provenance dict is carried, and always ``truncated_tokens``
    and ``dropped_before`` (the length-policy counts the metrics read); a document without a key
    gets ``0``.
    ``row`` is added: the batch row each document sits in.

    Args:
        rows: per batch row, the provenance dicts of its documents, in order.
        target_tokens: target labels of each document, flattened over rows (the collator counts
            them from the labels it writes); written as ``target_tokens`` when given.
    """
    documents = [document for row in rows for document in row]
    provenance: dict[str, list[Any]] = {
        SOURCE: [str(d[SOURCE]) for d in documents],
        EPOCH: [int(d[EPOCH]) for d in documents],
        TOKENS: [int(d[TOKENS]) for d in documents],
        ROW: [row for row, documents_in_row in enumerate(rows) for _ in documents_in_row],
        NEW_DOCUMENT: [bool(d[NEW_DOCUMENT]) for d in documents],
    }
    if target_tokens is not None:
        provenance[TARGET_TOKENS] = [int(count) for count in target_tokens]
    for key in sorted(set().union(*documents, (TRUNCATED_TOKENS, DROPPED_BEFORE)).difference(provenance)):
        provenance[key] = [document.get(key, 0) for document in documents]
    return provenance


def piece_targets(packs: Sequence[Pack], lens: Sequence[int], joined: np.ndarray | None, flat_labels: np.ndarray,
                   segment_starts: np.ndarray, segment_documents: np.ndarray) -> list[int]:
    """How many labels of each piece of a bulk-collated batch are targets, in order.

    A piece labelled by the shift has ``length - 1`` targets unless one of its tokens is
    ``IGNORE_INDEX`` itself: with the rows joined from flat token arrays whose values cannot be
    ``IGNORE_INDEX`` and no piece carrying its own labels, that is the count, from the lengths
    alone (a reduction over the labels cost about a tenth of a ``concat`` batch). Otherwise the
    labels are counted segment by segment.
    """
    if joined is not None and all(pack.extras is None for pack in packs):
        low, _ = integer_bounds(joined.dtype)
        if low > IGNORE_INDEX or joined.min() > IGNORE_INDEX:
            return [length - 1 for length in lens]
    return segment_targets(flat_labels, segment_starts)[segment_documents != PAD_DOCUMENT_ID].tolist()  # no padding
