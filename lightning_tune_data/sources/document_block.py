"""``DocumentBlock``: consecutive documents of one source read in one step, by reference.

A packer reads an indexed source in blocks of documents (``ArrowSource.read_block``) rather than one
document at a time: a block holds each document's row and the position of its first token in the
source's flat token array, with no Python object per document, plus what is needed to rebuild the
source's state after any number of its documents.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_tune_data.packing.pieces import token_arrays

if TYPE_CHECKING:
    from lightning_tune_data.sources.arrow import ArrowSource

__all__ = ["DocumentBlock"]


class DocumentBlock:
    """Consecutive documents of one source and pass: their tokens and row references, in order.

    Args:
        source, epoch: the source's name and the pass the documents belong to.
        tokens: each document's tokens: with ``store``, the position of its first token in
            ``store.flat_tokens()`` (an ``int``, no per-document object); without, a zero-copy view.
        lengths: each document's length (already cut to the length policy).
        rows: each document's row in the source.
        truncated_tokens: tokens cut from each document by the length policy.
        dropped_before: overlong documents dropped before each document since the previous one.
        start_state: the source's state just before the block was read.
        read_lengths: the length of every row read for the block, before the length policy.
        kept: the position among the rows read of each document in the block.
        store: the source whose flat token array ``tokens`` index, or ``None``.

    With ``start_state``, ``read_lengths`` and ``kept``, :meth:`ArrowSource.state_after_block`
    gives the source's state after any number of the block's documents, so a reader that holds
    documents of a block saves positions, not documents.
    """

    __slots__ = ("source", "epoch", "tokens", "lengths", "rows", "truncated_tokens", "dropped_before", "start_state",
                 "read_lengths", "kept", "store", "_skipped")

    def __init__(self, source: str, epoch: int, tokens: list[Any], lengths: list[int], rows: list[int],
                 truncated_tokens: list[int], dropped_before: list[int], start_state: dict[str, Any],
                 read_lengths: np.ndarray, kept: np.ndarray, store: ArrowSource | None) -> None:
        self.source = source
        self.epoch = epoch
        self.tokens = tokens
        self.lengths = lengths
        self.rows = rows
        self.truncated_tokens = truncated_tokens
        self.dropped_before = dropped_before
        self.start_state = start_state
        self.read_lengths = read_lengths
        self.kept = kept
        self.store = store
        self._skipped: tuple[list[int], list[int]] | None = None

    @property
    def stores(self) -> dict[str, ArrowSource]:
        """The sources whose flat token arrays the block's positions index, by name."""
        return {} if self.store is None else {self.source: self.store}

    @property
    def input_ids(self) -> list[np.ndarray]:
        """Each document's tokens as a zero-copy view."""
        return token_arrays(self.references(), self.tokens, self.stores)

    def skipped_through(self, read: int, max_seq_len: int | None) -> tuple[int, int]:
        """How many of the first ``read`` rows read were empty, and how many longer than ``max_seq_len``.

        Args:
            read: rows read for the block so far (at least 1).
            max_seq_len: the source's length limit (``None``: no limit).
        """
        if self._skipped is None:
            lengths = self.read_lengths
            over = np.zeros(len(lengths), np.int64) if max_seq_len is None else np.cumsum(lengths > max_seq_len)
            self._skipped = (np.cumsum(lengths == 0).tolist(), over.tolist())
        return self._skipped[0][read - 1], self._skipped[1][read - 1]

    def references(self) -> list[tuple]:
        """Per document ``(source, row, epoch, 0, length, True, truncated_tokens, dropped_before)``,
        the packer's piece references, built in one pass."""
        count = len(self.rows)
        return list(zip(itertools.repeat(self.source, count), self.rows, itertools.repeat(self.epoch, count),
                        itertools.repeat(0, count), self.lengths, itertools.repeat(True, count),
                        self.truncated_tokens, self.dropped_before))
