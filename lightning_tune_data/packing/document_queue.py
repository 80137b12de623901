"""The documents read in one block and not placed yet, by reference."""

from __future__ import annotations

import itertools
import operator
from typing import Any

from lightning_tune_data.packing.pieces import LENGTH_AT, PieceExtra, PieceTokens, Reference

__all__ = ["DocumentQueue"]


class DocumentQueue:
    """Documents read in a block and not placed yet: references, token views, optional extras.

    A document's tokens are a position in its source's flat token array (a block's) or a view.
    The placement loops read :attr:`refs` and :attr:`tokens` directly and move :attr:`at`.

    Args:
        refs: one piece reference per document, in order.
        tokens: each document's tokens.
        extras: each document's extra, or ``None`` when no document has one (a plain block).
        block: the source's block the documents were read in (``None``: documents restored from
            a saved state); the source rebuilds its position after any of them from it.
    """

    __slots__ = ("refs", "tokens", "extras", "block", "at", "_ends")

    def __init__(self, refs: list[Reference] | None = None, tokens: list[PieceTokens] | None = None,
                 extras: list[PieceExtra | None] | None = None, block: Any = None) -> None:
        self.refs = refs if refs is not None else []
        self.tokens = tokens if tokens is not None else []
        self.extras = extras
        self.block = block
        self.at = 0  # the next document to place
        self._ends: list[int] | None = None

    def __len__(self) -> int:
        """Documents not placed yet."""
        return len(self.refs) - self.at

    def ends(self) -> list[int]:
        """Cumulative token counts of the queued documents (computed once per queue)."""
        if self._ends is None:
            self._ends = list(itertools.accumulate(map(operator.itemgetter(LENGTH_AT), self.refs)))
        return self._ends

    def first(self, count: int) -> DocumentQueue:
        """A new queue of this queue's first ``count`` documents, none placed (no block: a replay
        places them again)."""
        return DocumentQueue(self.refs[:count], self.tokens[:count],
                             None if self.extras is None else self.extras[:count])
