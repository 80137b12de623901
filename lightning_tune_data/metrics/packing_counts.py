"""Positions, padding and packed rows of the train batches: the whole stream's packing efficiency.

:class:`PackingCounts` holds four plain ints, so the counts of several ranks merge by summing and
a checkpoint holds them as they are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch

from lightning_tune_data.keys import ATTENTION_MASK, DOCUMENT_IDS

__all__ = [
    "PACKED_ROWS",
    "PACKED_ROW_DOCS",
    "PACKING_COUNTERS",
    "PADDING_POSITIONS",
    "PackingCounts",
    "TOTAL_POSITIONS",
]

#: Positions of every batch that carries ``attention_mask`` or ``document_ids``.
TOTAL_POSITIONS = "total_positions"
#: Positions among them holding padding.
PADDING_POSITIONS = "padding_positions"
#: Rows of packed batches (those with ``document_ids``).
PACKED_ROWS = "packed_rows"
#: Document pieces in those rows.
PACKED_ROW_DOCS = "packed_row_docs"
#: The counters, which are also the keys of :meth:`PackingCounts.state_dict`.
PACKING_COUNTERS = (TOTAL_POSITIONS, PADDING_POSITIONS, PACKED_ROWS, PACKED_ROW_DOCS)


class PackingCounts:
    """Counts positions, padding and (for packed batches) rows and document pieces.

    They give the stream's ``padding_share`` and, once a packed batch was seen,
    ``packing_efficiency`` and ``docs_per_pack``.
    """

    def __init__(self) -> None:
        self.counts: dict[str, int] = dict.fromkeys(PACKING_COUNTERS, 0)

    def add(self, batch: Mapping[str, Any], num_records: int) -> None:
        """Count one batch.

        Args:
            batch: The batch (``attention_mask`` and/or ``document_ids`` are read; padding is where
                the mask is 0, or else where ``document_ids`` is negative).
            num_records: Provenance records (document pieces) in the batch.
        """
        counts = self.counts
        mask = batch.get(ATTENTION_MASK)
        doc_ids = batch.get(DOCUMENT_IDS)
        if isinstance(mask, torch.Tensor):
            counts[TOTAL_POSITIONS] += mask.numel()
            counts[PADDING_POSITIONS] += int((mask == 0).sum())
        elif isinstance(doc_ids, torch.Tensor):
            counts[TOTAL_POSITIONS] += doc_ids.numel()
            counts[PADDING_POSITIONS] += int((doc_ids < 0).sum())
        if isinstance(doc_ids, torch.Tensor):
            counts[PACKED_ROWS] += doc_ids.shape[0] if doc_ids.dim() > 1 else 1
            counts[PACKED_ROW_DOCS] += num_records

    @staticmethod
    def summed(states: Iterable[Mapping[str, int]]) -> dict[str, int]:
        """Every counter summed over several ranks' :meth:`state_dict`.

        Args:
            states: One state per rank, each holding every counter.
        """
        states = list(states)
        return {key: sum(int(state[key]) for state in states) for key in PACKING_COUNTERS}

    @staticmethod
    def add_stream_metrics(counts: Mapping[str, int], stream: dict[str, Any]) -> None:
        """Add ``padding_share``, ``packing_efficiency`` and ``docs_per_pack`` to the stream's metrics.

        Each is added only once it is defined: ``padding_share`` after a batch with positions,
        the other two after a packed batch.

        Args:
            counts: Counters (one rank's, or :meth:`summed` over ranks).
            stream: The whole stream's metrics (modified in place).
        """
        if counts[TOTAL_POSITIONS]:
            stream["padding_share"] = counts[PADDING_POSITIONS] / counts[TOTAL_POSITIONS]
        if counts[PACKED_ROWS]:
            stream["packing_efficiency"] = 1.0 - stream["padding_share"]
            stream["docs_per_pack"] = counts[PACKED_ROW_DOCS] / counts[PACKED_ROWS]

    @staticmethod
    def folded(states: Iterable[Mapping[str, int]]) -> dict[str, int]:
        """One state equal to several ranks' states together (every key found is summed).

        Args:
            states: :meth:`state_dict` of each old rank (a missing state is ``{}``).
        """
        folded: dict[str, int] = {}
        for state in states:
            for key, value in state.items():
                folded[key] = folded.get(key, 0) + int(value)
        return folded

    def state_dict(self) -> dict[str, int]:
        """``{counter: count}`` for every counter of :data:`PACKING_COUNTERS` (plain ints)."""
        return dict(self.counts)

    def load_state_dict(self, state_dict: Mapping[str, int]) -> None:
        """Restore counters saved by :meth:`state_dict` (a missing counter restarts at 0).

        Args:
            state_dict: What :meth:`state_dict` returned.
        """
        self.counts = {key: int(state_dict.get(key, 0)) for key in PACKING_COUNTERS}
