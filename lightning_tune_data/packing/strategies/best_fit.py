"""``"best_fit"``: best-fit over at most ``buffer_size`` open packs.

Each document goes into the open pack with the least free space that still holds it (oldest on
ties); if none holds it, it opens a new pack; when more than ``buffer_size`` packs are open, the
fullest (oldest on ties) is finished. A pack that becomes exactly full is finished at once. With
``buffer_size=64`` this fills >= 99% of the tokens of packs of 2048 with log-normal document
lengths of mean ~300. A document can wait while its pack fills, but at most ``buffer_size`` packs
are ever held. Documents are never split.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from lightning_tune_data.packing.document_queue import DocumentQueue
from lightning_tune_data.packing.pack import Pack
from lightning_tune_data.packing.pieces import LENGTH_AT, PieceExtra, PieceTokens, Reference
from lightning_tune_data.packing.strategies.base import PackingStrategy, register_strategy

if TYPE_CHECKING:
    from lightning_tune_data.packing.placement import PackPlacer

__all__ = ["BestFit", "free_key"]

# The open packs' (free space, number) pairs are kept as single ints, ordered like the pairs:
# integer comparisons make the per-document bisect and insort several times cheaper.
_NUMBER_BITS = 40
_NUMBER_MASK = (1 << _NUMBER_BITS) - 1


def free_key(space: int, number: int) -> int:
    """The sort key of an open pack with ``space`` free tokens and creation ``number``."""
    return (space << _NUMBER_BITS) | number


@register_strategy
class BestFit(PackingStrategy):
    """The tightest open pack that holds the document (see the module docstring).

    Args:
        placer: the placer it places for; its ``buffer_size`` bounds the open packs.
    """

    name = "best_fit"

    def __init__(self, placer: PackPlacer) -> None:
        super().__init__(placer)
        self.buffer_size = placer.buffer_size
        # Every open pack's free_key(free space, number), sorted: fullest first, oldest on ties.
        self.free: list[int] = []

    def set_open(self, packs: list[Pack]) -> None:
        """Replace the open packs (oldest first) and rebuild their free-space keys."""
        super().set_open(packs)
        self.free = sorted(free_key(self.max_seq_len - pack.length, number) for number, pack in self.open.items())

    def add(self, ref: Reference, tokens: PieceTokens, extra: PieceExtra | None) -> None:
        """Append the piece to the tightest open pack that holds it, or open a new pack."""
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
        self._open_new(pack)

    def _open_new(self, pack: Pack) -> None:
        """A new pack: finished at once when full, else opened (the fullest open pack is
        finished, oldest on ties, when that makes more than ``buffer_size``)."""
        space = self.max_seq_len - pack.length
        if not space:
            self.ready.append(pack)
            return
        number = self.next_number  # open_pack and free_key inlined: this runs for every new pack
        self.next_number = number + 1
        open_packs = self.open
        open_packs[number] = pack
        bisect.insort(self.free, (space << _NUMBER_BITS) | number)
        if len(open_packs) > self.buffer_size:
            self.ready.append(open_packs.pop(self.free.pop(0) & _NUMBER_MASK))

    def place_block(self, queue: DocumentQueue, until_ready: int) -> int:
        """:meth:`add` over a plain queue until ``until_ready`` packs are finished, with the common
        cases inlined (an overlong document takes the placer's general path)."""
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
            elif n > cap:  # overlong (it fits in no pack): the placer applies the policy
                self.placer.place(ref, tokens[at], None)
            else:  # fits in no open pack: opens one
                self._open_new(Pack(stores, [ref], [tokens[at]], n))
            if len(ready) >= until_ready:
                placed = at + 1
                break
        queue.at = placed
        return placed - start
