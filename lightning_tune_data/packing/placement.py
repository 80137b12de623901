"""Where each document goes: the open and finished packs of one packing strategy.

:class:`PackPlacer` owns the packs being filled and the queue of finished ones; the packer feeds
it pieces (a reference tuple, a token view and an optional extra, see ``pack_pieces.py``) one at
a time, or a whole :class:`DocumentQueue` of documents read in a block. For a queue it places
documents only until a given number of packs is finished, so the packer's state after the packs
it hands out still describes exactly the position after them; the common cases (a document that
fits in an open ``best_fit`` pack, the run of whole documents that fit in the open ``concat``
pack) are placed without a method call per document.

Strategies (their full description is in ``packing.py``): ``greedy`` (next-fit), ``best_fit``
(the open pack with the least free space that holds the document, oldest on ties; at most
``buffer_size`` open packs) and ``concat`` (documents back to back, cut at ``max_seq_len``).
"""

from __future__ import annotations

import bisect
import collections
import itertools
import operator
from collections.abc import Callable
from typing import Any

from lightning_tune_data.packing.pieces import (
    LENGTH_AT,
    TRUNCATED_AT,
    Pack,
    PieceExtra,
    PieceTokens,
    Reference,
    split_piece,
)

PieceAdder = Callable[[Reference, PieceTokens, "PieceExtra | None"], None]

# best_fit keeps its open packs' (free space, number) pairs as single ints, ordered like the
# pairs: integer comparisons make the per-document bisect and insort several times cheaper.
_NUMBER_BITS = 40
_NUMBER_MASK = (1 << _NUMBER_BITS) - 1


def free_key(space: int, number: int) -> int:
    """The sort key of an open pack with ``space`` free tokens and creation ``number``."""
    return (space << _NUMBER_BITS) | number


class DocumentQueue:
    """Documents read in a block and not placed yet: references, token views, optional extras.

    Args:
        refs: one piece reference per document, in order.
        tokens: each document's token view.
        extras: each document's extra, or ``None`` when no document has one (a plain block).
        block: the source's block the documents were read in (``None``: documents restored from
            a saved state); the source rebuilds its position after any of them from it.

    A document's tokens are a position in its source's flat token array (a block's) or a view.
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


class PackPlacer:
    """The open packs (by creation number, oldest first) and the finished packs of one strategy.

    Args:
        strategy: ``"greedy"``, ``"best_fit"`` or ``"concat"``.
        max_seq_len: the most tokens in one pack.
        buffer_size: open packs kept by ``best_fit``.
        overlong: ``"truncate"`` or ``"drop"``: what ``greedy``/``best_fit`` do with a document longer
            than ``max_seq_len``.
        counters: the packer's counters; ``overlong_truncated``/``overlong_dropped`` are counted here.
    """

    def __init__(self, strategy: str, max_seq_len: int, buffer_size: int, overlong: str,
                 counters: dict[str, int]) -> None:
        self.strategy = strategy
        self.max_seq_len = max_seq_len
        self.buffer_size = buffer_size
        self.overlong = overlong
        self.counters = counters
        self.open: dict[int, Pack] = {}
        # best_fit: every open pack's free_key(free space, number), sorted: fullest first, oldest on ties.
        self.free: list[int] = []
        self.next_number = 0
        self.ready: collections.deque[Pack] = collections.deque()
        # By source name, the sources whose flat token arrays the queued documents' positions index.
        self.stores: dict[str, Any] = {}
        self.add: PieceAdder = self._adder()

    def _adder(self) -> PieceAdder:
        return {"concat": self._add_concat, "greedy": self._add_greedy, "best_fit": self._add_best_fit}[self.strategy]

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["add"]  # a bound method: rebuilt on unpickling
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.add = self._adder()

    # -- open packs ------------------------------------------------------------------------
    def _open_pack(self, pack: Pack) -> int:
        number = self.next_number
        self.next_number += 1
        self.open[number] = pack
        return number

    def set_open(self, packs: list[Pack]) -> None:
        """Replace the open packs (oldest first)."""
        self.open, self.free, self.next_number = {}, [], 0
        for pack in packs:
            pack.stores = self.stores
            number = self._open_pack(pack)
            if self.strategy == "best_fit":
                self.free.append(free_key(self.max_seq_len - pack.length, number))
        self.free.sort()

    def close_all(self) -> None:
        """Finish every open pack that holds tokens (the child stream ended)."""
        self.ready.extend(pack for pack in self.open.values() if pack.length)
        self.set_open([])

    # -- one piece ---------------------------------------------------------------------------
    def place(self, ref: Reference, tokens: PieceTokens, extra: PieceExtra | None) -> None:
        """Place one document, applying the overlong policy of ``greedy``/``best_fit``."""
        limit = self.max_seq_len
        if self.strategy != "concat" and ref[LENGTH_AT] > limit:
            if self.overlong == "drop":
                self.counters["overlong_dropped"] += 1
                return
            self.counters["overlong_truncated"] += 1
            cut = ref[LENGTH_AT] - limit
            ref, tokens, extra = split_piece(ref, tokens, extra, 0, limit)
            ref = ref[:TRUNCATED_AT] + (ref[TRUNCATED_AT] + cut,) + ref[TRUNCATED_AT + 1 :]
        self.add(ref, tokens, extra)

    def _add_concat(self, ref: Reference, tokens: PieceTokens, extra: PieceExtra | None) -> None:
        cap, open_packs = self.max_seq_len, self.open
        if open_packs:
            number, pack = next(iter(open_packs.items()))
        else:
            pack = Pack(self.stores)
            number = self._open_pack(pack)
        n = ref[LENGTH_AT]
        if pack.length + n < cap:  # the common case: the whole document fits with room to spare
            pack.add(ref, tokens, extra)
            return
        offset = 0
        while offset < n:
            take = min(cap - pack.length, n - offset)
            if take == n:
                pack.add(ref, tokens, extra)
            else:
                pack.add(*split_piece(ref, tokens, extra, offset, take))
            offset += take
            if pack.length == cap:
                self.ready.append(open_packs.pop(number))
                pack = Pack(self.stores)
                number = self._open_pack(pack)
        if pack.length == 0:
            del open_packs[number]

    def _add_greedy(self, ref: Reference, tokens: PieceTokens, extra: PieceExtra | None) -> None:
        cap, open_packs = self.max_seq_len, self.open
        if open_packs:
            number, pack = next(iter(open_packs.items()))
            if pack.length + ref[LENGTH_AT] > cap:
                self.ready.append(open_packs.pop(number))
        if open_packs:
            number, pack = next(iter(open_packs.items()))
        else:
            pack = Pack(self.stores)
            number = self._open_pack(pack)
        pack.add(ref, tokens, extra)
        if pack.length == cap:
            self.ready.append(open_packs.pop(number))

    def _add_best_fit(self, ref: Reference, tokens: PieceTokens, extra: PieceExtra | None) -> None:
        cap, free = self.max_seq_len, self.free
        n = ref[LENGTH_AT]
        i = bisect.bisect_left(free, n << _NUMBER_BITS)
        if i < len(free):
            key = free.pop(i)
            number = key & _NUMBER_MASK
            pack = self.open[number]
            pack.add(ref, tokens, extra)
            if pack.length == cap:
                self.ready.append(self.open.pop(number))
            else:
                bisect.insort(free, key - (n << _NUMBER_BITS))
            return
        pack = Pack(self.stores)
        pack.add(ref, tokens, extra)
        self._open_best_fit(pack)

    def _open_best_fit(self, pack: Pack) -> None:
        """A new ``best_fit`` pack: finished at once when full, else opened (the fullest open pack
        is emitted, oldest on ties, when that makes more than ``buffer_size``)."""
        space = self.max_seq_len - pack.length
        if not space:
            self.ready.append(pack)
            return
        number = self.next_number  # _open_pack and free_key inlined: this runs for every new pack
        self.next_number = number + 1
        open_packs = self.open
        open_packs[number] = pack
        bisect.insort(self.free, (space << _NUMBER_BITS) | number)
        if len(open_packs) > self.buffer_size:
            self.ready.append(open_packs.pop(self.free.pop(0) & _NUMBER_MASK))

    # -- a queue of documents ---------------------------------------------------------------
    def place_from(self, queue: DocumentQueue, until_ready: int = 1) -> int:
        """Place queued documents until :attr:`ready` holds ``until_ready`` finished packs (or the
        queue is empty); returns how many documents were placed.

        A document finishes at most one ``greedy``/``best_fit`` pack, so those stop right after
        the document that finished the last pack asked for; a ``concat`` document can fill several.
        """
        return self.placement_for(queue)(queue, until_ready)

    def placement_for(self, queue: DocumentQueue) -> Callable[[DocumentQueue, int], int]:
        """What :meth:`place_from` runs for ``queue``: the strategy's loop over plain documents
        (no extras) for ``concat`` and ``best_fit``, else one :meth:`place` per document. A
        reader that places the same queue many times looks it up once."""
        if queue.extras is None and self.strategy == "concat":
            return self._concat_from
        if queue.extras is None and self.strategy == "best_fit":
            return self._best_fit_from
        return self._place_each_from

    def _place_each_from(self, queue: DocumentQueue, until_ready: int) -> int:
        start, refs, tokens, extras, ready, place = queue.at, queue.refs, queue.tokens, queue.extras, self.ready, self.place
        while queue.at < len(refs) and len(ready) < until_ready:
            at = queue.at
            queue.at += 1
            place(refs[at], tokens[at], None if extras is None else extras[at])
        return queue.at - start

    def _best_fit_from(self, queue: DocumentQueue, until_ready: int) -> int:
        """:meth:`_add_best_fit` over a plain queue until ``until_ready`` packs are finished, with the
        common cases inlined."""
        refs, tokens = queue.refs, queue.tokens
        count, ready, length_at = len(refs), self.ready, LENGTH_AT
        cap, free, open_packs, stores = self.max_seq_len, self.free, self.open, self.stores
        bisect_left, insort, shift, mask = bisect.bisect_left, bisect.insort, _NUMBER_BITS, _NUMBER_MASK
        start = queue.at
        placed = count
        for at in range(start, count):
            ref = refs[at]
            n = ref[length_at]
            need = n << shift
            i = bisect_left(free, need)
            if i < len(free):  # the common case: the tightest open pack that holds the document
                key = free.pop(i)
                pack = open_packs[key & mask]
                pack.refs.append(ref)
                pack.tokens.append(tokens[at])
                pack.length += n
                rest = key - need  # the pack's key after the document
                if rest > mask:  # space left
                    insort(free, rest)
                    continue
                ready.append(open_packs.pop(key & mask))
            elif n > cap:  # overlong (it fits in no pack): the general path applies the policy
                self.place(ref, tokens[at], None)
            else:  # fits in no open pack: opens one
                self._open_best_fit(Pack(stores, [ref], [tokens[at]], n))
            if len(ready) >= until_ready:
                placed = at + 1
                break
        queue.at = placed
        return placed - start

    def _concat_from(self, queue: DocumentQueue, until_ready: int) -> int:
        """:meth:`_add_concat` over a plain queue until ``until_ready`` packs are finished: each time, the
        run of whole documents that fit in the open pack is appended in one step, then the
        document that fills it is split."""
        placed = 0
        ready = self.ready
        while len(ready) < until_ready:
            count = self._concat_one(queue)
            if not count:
                break
            placed += count
        return placed

    def _concat_one(self, queue: DocumentQueue) -> int:
        """One run of whole documents and the document that fills the open pack (see :meth:`_concat_from`)."""
        refs, tokens, at, count = queue.refs, queue.tokens, queue.at, len(queue.refs)
        if at >= count:
            return 0
        ends = queue.ends()
        if self.open:
            pack = next(iter(self.open.values()))
        else:
            pack = Pack(self.stores)
            self._open_pack(pack)
        before = ends[at - 1] if at else 0
        last = bisect.bisect_left(ends, before + self.max_seq_len - pack.length, lo=at)  # fills the pack
        whole = min(last, count)
        if whole > at:
            pack.refs.extend(refs[at:whole])
            pack.tokens.extend(tokens[at:whole])
            pack.length += ends[whole - 1] - before
        if whole == count:
            queue.at = count
            return count - at
        self._add_concat(refs[last], tokens[last], None)
        queue.at = last + 1
        return last + 1 - at
