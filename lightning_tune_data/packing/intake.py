"""Documents in, one at a time: a child's document samples checked, cut and placed as pieces.

Used for children that do not hand out blocks (transforms, filters, loss masks, streaming
sources): each sample is checked (1-D integer ``input_ids``, a matching ``loss_mask``), counted,
cut or dropped by the overlong policy unless the strategy splits documents, and turned into a
piece: a zero-copy view with its reference, or, for a document that cannot be re-read, a copy
whose tokens travel in the state.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from lightning_tune_data.keys import (
    DROPPED_BEFORE,
    EPOCH,
    INPUT_IDS,
    LOSS_MASK,
    SOURCE,
    SOURCE_ROW,
    TRUNCATED_TOKENS,
    OverlongPolicy,
)
from lightning_tune_data.packing.pieces import Piece, PieceExtra, document_labels, reference
from lightning_tune_data.packing.progress import PackingProgress

__all__ = ["DocumentIntake"]

_END = object()
#: Documents in a row that can't be packed (empty, or dropped as overlong) before the packer gives
#: up instead of reading an infinite stream forever.
_MAX_UNUSABLE_IN_A_ROW = 100_000


class DocumentIntake:
    """A child's document samples, read one at a time, as placed pieces (see the module docstring).

    Args:
        progress: the packer's position: its placer places the pieces, its counters count them.
        packer_name: the packer's name (for error messages).
        child_name: the child's name (the source of a sample that names none).
        max_seq_len: the most tokens in one pack.
        overlong: ``"truncate"`` or ``"drop"`` a document longer than ``max_seq_len`` (unless the
            strategy splits documents).
    """

    def __init__(self, progress: PackingProgress, packer_name: str, child_name: str, max_seq_len: int,
                 overlong: OverlongPolicy) -> None:
        self.progress = progress
        self.placer = progress.placer
        self.counters = progress.counters
        self.packer_name = packer_name
        self.child_name = child_name
        self.max_seq_len = max_seq_len
        self.overlong = overlong
        self.splits_documents = progress.placer.splits_documents

    def place_next(self, documents: Iterator[dict[str, Any]], unusable: int) -> int:
        """Place the next document of ``documents`` (at its end, the child has ended).

        Args:
            documents: the child's iterator.
            unusable: documents in a row before this one that could not be packed.

        Returns:
            The count of unusable documents in a row after this one.

        Raises:
            RuntimeError: too many documents in a row were empty or dropped.
        """
        sample = next(documents, _END)
        if sample is _END:
            self.progress.end_child()
            return unusable
        piece = self.prepare(sample)
        if piece is not None:
            self.placer.add(*piece)
            return 0
        unusable += 1
        if unusable >= _MAX_UNUSABLE_IN_A_ROW:
            raise RuntimeError(
                f"Packer '{self.packer_name}': the last {unusable:,} documents of '{self.child_name}' "
                f"were all empty or dropped as longer than max_seq_len={self.max_seq_len} "
                f"({self.counters}); nothing can be packed. Check the data and the overlong policy."
            )
        return unusable

    def prepare(self, sample: dict[str, Any]) -> Piece | None:
        """One document sample as a piece (reference, token view, extra); ``None``: not packable
        (empty, or dropped as overlong; counted).

        Args:
            sample: a document sample of the child.
        """
        if INPUT_IDS not in sample:
            raise KeyError(
                f"Packer '{self.packer_name}': a sample of '{self.child_name}' has no "
                f"'{INPUT_IDS}' (keys: {sorted(sample)}); pack document samples, not packed ones."
            )
        ids = sample[INPUT_IDS]
        if type(ids) is not np.ndarray or ids.dtype.kind not in "iu":  # the cache's views pass as they are
            ids = np.asarray(ids, dtype=np.int64)
        source = sample.get(SOURCE)
        source = self.child_name if source is None else str(source)
        if ids.ndim != 1:
            raise ValueError(
                f"Packer '{self.packer_name}': '{INPUT_IDS}' of a document from '{source}' has "
                f"shape {ids.shape}; documents must be 1-D token-id arrays."
            )
        mask = sample.get(LOSS_MASK)
        if mask is not None:
            mask = np.asarray(mask, dtype=bool)
            if mask.shape != ids.shape:
                raise ValueError(
                    f"Packer '{self.packer_name}': '{LOSS_MASK}' of a document from '{source}' has "
                    f"shape {mask.shape} but '{INPUT_IDS}' has {ids.shape}; give one flag per token."
                )
        counters = self.counters
        counters["documents"] += 1
        truncated = int(sample.get(TRUNCATED_TOKENS, 0))
        n = len(ids)
        if n == 0:
            counters["empty_dropped"] += 1
            return None
        if n > self.max_seq_len and not self.splits_documents:
            if self.overlong == "drop":
                counters["overlong_dropped"] += 1
                return None
            counters["overlong_truncated"] += 1
            truncated += n - self.max_seq_len
            ids = ids[: self.max_seq_len]
            mask = None if mask is None else mask[: self.max_seq_len]
        row = sample.get(SOURCE_ROW)
        labels = None if mask is None else document_labels(ids, mask)
        ref = reference(source, row, int(sample.get(EPOCH, 0)), len(ids), truncated, int(sample.get(DROPPED_BEFORE, 0)))
        if row is None:  # cannot be re-read: own the tokens (they travel in the state)
            ids = ids.copy()
            mask = None if mask is None else mask.copy()
            return ref, ids, None if mask is None else PieceExtra(labels, mask)
        # A re-readable document stays a zero-copy view; only a masked one needs explicit labels.
        return ref, ids, None if labels is None else PieceExtra(labels, None)
