"""``LengthPolicy``: what a source does with empty documents and documents longer than ``max_seq_len``.

Empty documents are skipped (they would make zero-width rows). A document longer than
``max_seq_len`` is cut to its first ``max_seq_len`` tokens (``overlong="truncate"``; the sample
says how many tokens it lost, ``truncated_tokens``) or skipped (``"drop"``; the next document
handed out says how many were dropped since the previous one, ``dropped_before``). Everything is
counted in the source's counters. The policy applies to one document (:meth:`LengthPolicy.apply`)
or, with the same counts, to every row of a block read at once (:meth:`LengthPolicy.block`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lightning_tune_data.keys import INPUT_IDS, LOSS_MASK, TRUNCATED_TOKENS
from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.arrow_columns import ListColumn
from lightning_tune_data.sources.document_block import DocumentBlock
from lightning_tune_data.sources.source_state import SourceCounters

__all__ = ["LengthPolicy"]


class LengthPolicy:
    """The length policy of one source shard, and the overlong documents it dropped since it last
    handed one out.

    Args:
        settings: the run's settings (``max_seq_len`` and ``overlong`` are read).
        counters: the source's counters (``empty_skipped``, ``overlong_truncated`` and
            ``overlong_dropped`` are counted into them).
    """

    __slots__ = ("settings", "counters", "dropped_since_yield")

    def __init__(self, settings: StreamSettings, counters: SourceCounters) -> None:
        self.settings = settings
        self.counters = counters
        #: Overlong documents dropped since the last document handed out (its ``dropped_before``).
        self.dropped_since_yield = 0

    def apply(self, sample: dict[str, Any], count: bool = True) -> dict[str, Any] | None:
        """The sample within the policy (a cut copy when truncated); ``None`` when it is skipped.

        Args:
            sample: a document sample.
            count: count what is skipped or cut (``False`` when a document is read again by reference).
        """
        length = len(sample[INPUT_IDS])
        if length == 0:
            self.counters.empty_skipped += count
            return None
        cap = self.settings.max_seq_len
        if cap is None or length <= cap:
            return sample
        if self.settings.overlong == "drop":
            self.counters.overlong_dropped += count
            self.dropped_since_yield += count
            return None
        self.counters.overlong_truncated += count
        sample = dict(sample)
        sample[INPUT_IDS] = sample[INPUT_IDS][:cap]
        if LOSS_MASK in sample:
            sample[LOSS_MASK] = sample[LOSS_MASK][:cap]
        sample[TRUNCATED_TOKENS] = length - cap
        return sample

    def block(self, source: str, epoch: int, rows: np.ndarray, column: ListColumn, start_state: dict[str, Any],
              store: Any) -> DocumentBlock | None:
        """The documents at ``rows`` after the policy, in bulk, counting what it skips; ``None``
        when it keeps none of them.

        Args:
            source, epoch: the source's name and the pass the rows belong to.
            rows: the rows read, in order.
            column: the source's ``input_ids`` column.
            start_state: the source's state before these rows were read.
            store: the source, whose flat token array the block's positions index (used when the
                column has a flat view; otherwise each document is a zero-copy view).
        """
        flat = column.flat()
        if flat is not None:  # positions in the flat token array: no object per document
            positions, lengths = flat.positions(rows)
            tokens: Any = positions
        else:
            tokens, lengths = column.rows_and_lengths(rows)
        keep = lengths > 0
        self.counters.empty_skipped += len(lengths) - int(np.count_nonzero(keep))
        truncated = dropped_before = None
        kept_lengths = lengths
        cap = self.settings.max_seq_len
        if cap is not None and int(lengths.max(initial=0)) > cap:
            over = lengths > cap
            if self.settings.overlong == "drop":
                dropped = np.cumsum(over)
                self.counters.overlong_dropped += int(dropped[-1])
                keep &= ~over
                kept = np.flatnonzero(keep)
                before = np.diff(dropped[kept], prepend=0)
                if len(kept):
                    before[0] += self.dropped_since_yield
                    self.dropped_since_yield = int(dropped[-1] - dropped[kept[-1]])
                else:
                    self.dropped_since_yield += int(dropped[-1])
                dropped_before = before.tolist()
            else:
                self.counters.overlong_truncated += int(np.count_nonzero(over))
                truncated = np.where(over, lengths - cap, 0)
                kept_lengths = np.minimum(lengths, cap)
                if flat is None:
                    for index in np.flatnonzero(over).tolist():
                        tokens[index] = tokens[index][:cap]
        kept = np.flatnonzero(keep)
        if not len(kept):
            return None
        everything = len(kept) == len(lengths)
        count = len(kept)
        if dropped_before is None:
            dropped_before = [0] * count
            dropped_before[0], self.dropped_since_yield = self.dropped_since_yield, 0
        if flat is not None:
            tokens = (tokens if everything else tokens[kept]).tolist()
        elif not everything:
            tokens = [tokens[i] for i in kept.tolist()]
        return DocumentBlock(
            source, epoch,
            tokens,
            (kept_lengths if everything else kept_lengths[kept]).tolist(),
            (rows if everything else rows[kept]).tolist(),
            [0] * count if truncated is None else truncated[kept].tolist(),
            dropped_before,
            start_state,
            lengths,
            kept,
            None if flat is None else store,
        )
