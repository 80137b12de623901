"""The placer: a strategy's open packs, the finished packs, and the overlong policy.

:class:`PackPlacer` composes one :class:`~lightning_tune_data.packing.strategies.PackingStrategy`
(which owns the open packs and decides where each document goes) with what every strategy
shares: the queue of finished packs (:attr:`~PackPlacer.ready`), the sources whose flat token
arrays the pieces' positions index (:attr:`~PackPlacer.stores`), and the overlong policy. The
packer feeds it pieces one at a time (:attr:`~PackPlacer.add`, :meth:`~PackPlacer.place`) or a
whole :class:`~lightning_tune_data.packing.document_queue.DocumentQueue` of a block's documents;
for a queue it places documents only until a given number of packs is finished, so the packer's
state after the packs it hands out still describes exactly the position after them.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from lightning_tune_data.keys import OverlongPolicy
from lightning_tune_data.packing.document_queue import DocumentQueue
from lightning_tune_data.packing.pack import Pack
from lightning_tune_data.packing.pieces import LENGTH_AT, TRUNCATED_AT, PieceExtra, PieceTokens, Reference, split_piece
from lightning_tune_data.packing.strategies import PackingStrategy, get_strategy

__all__ = ["BlockPlacement", "PackPlacer", "PieceAdder"]

#: Places one piece: ``(reference, tokens, extra)``.
PieceAdder = Callable[[Reference, PieceTokens, "PieceExtra | None"], None]
#: Places a queue's documents until a number of packs is finished; returns how many it placed.
BlockPlacement = Callable[[DocumentQueue, int], int]


class PackPlacer:
    """The open packs of one strategy, the finished packs, and the overlong policy.

    Args:
        strategy: the registered name of the strategy that places documents.
        max_seq_len: the most tokens in one pack.
        buffer_size: open packs kept by a strategy that keeps several (``best_fit``).
        overlong: ``"truncate"`` or ``"drop"``: what happens to a document longer than
            ``max_seq_len`` when the strategy does not split documents.
        counters: the packer's counters; ``overlong_truncated``/``overlong_dropped`` are counted here.
        stores: by source name, the sources whose flat token arrays the pieces' positions index
            (default: a new, empty dict; a replay shares the original placer's).
    """

    def __init__(self, strategy: str, max_seq_len: int, buffer_size: int, overlong: OverlongPolicy,
                 counters: dict[str, int], stores: dict[str, Any] | None = None) -> None:
        self.max_seq_len = max_seq_len
        self.buffer_size = buffer_size
        self.overlong = overlong
        self.counters = counters
        self.ready: collections.deque[Pack] = collections.deque()
        self.stores: dict[str, Any] = {} if stores is None else stores
        self.strategy: PackingStrategy = get_strategy(strategy)(self)
        self.splits_documents = self.strategy.splits_documents
        #: Places one piece after the overlong policy: the strategy's ``add``.
        self.add: PieceAdder = self.strategy.add

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["add"]  # a bound method: rebuilt on unpickling
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.add = self.strategy.add

    def like(self, counters: dict[str, int]) -> PackPlacer:
        """A new placer with this one's strategy, settings and stores, and no packs.

        Args:
            counters: the counters it counts into.
        """
        return PackPlacer(self.strategy.name, self.max_seq_len, self.buffer_size, self.overlong, counters, self.stores)

    def held_packs(self) -> tuple[list[Pack], list[int], int]:
        """The open packs (oldest first) then the finished ones not handed out, each one's piece
        count now (packs only ever grow by appending), and how many are open."""
        packs = list(self.strategy.open.values())
        num_open = len(packs)
        packs.extend(self.ready)
        return packs, [len(pack.refs) for pack in packs], num_open

    def set_open(self, packs: list[Pack]) -> None:
        """Replace the open packs (oldest first)."""
        self.strategy.set_open(packs)

    def close_all(self) -> None:
        """Finish every open pack that holds tokens (the child stream ended)."""
        self.ready.extend(pack for pack in self.strategy.open.values() if pack.length)
        self.strategy.set_open([])

    def place(self, ref: Reference, tokens: PieceTokens, extra: PieceExtra | None) -> None:
        """Place one document, applying the overlong policy unless the strategy splits documents."""
        limit = self.max_seq_len
        if ref[LENGTH_AT] > limit and not self.splits_documents:
            if self.overlong == "drop":
                self.counters["overlong_dropped"] += 1
                return
            self.counters["overlong_truncated"] += 1
            cut = ref[LENGTH_AT] - limit
            ref, tokens, extra = split_piece(ref, tokens, extra, 0, limit)
            ref = ref[:TRUNCATED_AT] + (ref[TRUNCATED_AT] + cut,) + ref[TRUNCATED_AT + 1 :]
        self.add(ref, tokens, extra)

    def place_from(self, queue: DocumentQueue, until_ready: int = 1) -> int:
        """Place queued documents until :attr:`ready` holds ``until_ready`` finished packs (or the
        queue is empty); returns how many documents were placed.

        Args:
            queue: the documents, from ``queue.at`` on.
            until_ready: finished packs to stop at.
        """
        return self.placement_for(queue)(queue, until_ready)

    def placement_for(self, queue: DocumentQueue) -> BlockPlacement:
        """What :meth:`place_from` runs for ``queue``: the strategy's loop over a plain block (no
        extras), else one :meth:`place` per document. A reader that places the same queue many
        times looks it up once."""
        if queue.extras is None:
            return self.strategy.place_block
        return self.strategy.place_each
