"""``"concat"``: pretraining style. Documents back to back, cut into packs of exactly ``max_seq_len``.

Documents (which already carry BOS/EOS) are concatenated and cut into blocks of exactly
``max_seq_len`` tokens; the part of a document that does not fit is carried into the next block,
so no token is dropped and no document is overlong. Every piece is its own "document" in the
pack (positions restart, last label ignored); a continuation has ``new_document=False``.
"""

from __future__ import annotations

import bisect

from lightning_tune_data.packing.document_queue import DocumentQueue
from lightning_tune_data.packing.pack import Pack
from lightning_tune_data.packing.pieces import LENGTH_AT, PieceExtra, PieceTokens, Reference, split_piece
from lightning_tune_data.packing.strategies.base import PackingStrategy, register_strategy

__all__ = ["Concat"]


@register_strategy
class Concat(PackingStrategy):
    """Documents back to back, cut at ``max_seq_len`` (see the module docstring)."""

    name = "concat"
    splits_documents = True

    def add(self, ref: Reference, tokens: PieceTokens, extra: PieceExtra | None) -> None:
        """Append the piece to the open pack, cutting it where the pack is full; the rest opens
        the next pack (as many as it fills)."""
        cap, open_packs = self.max_seq_len, self.open
        if open_packs:
            number, pack = next(iter(open_packs.items()))
        else:
            pack = Pack(self.stores)
            number = self.open_pack(pack)
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
                number = self.open_pack(pack)
        if pack.length == 0:
            del open_packs[number]

    def place_block(self, queue: DocumentQueue, until_ready: int) -> int:
        """:meth:`add` over a plain queue until ``until_ready`` packs are finished: each time, the
        run of whole documents that fit in the open pack is appended in one step, then the
        document that fills it is split (it may fill several packs)."""
        placed = 0
        ready = self.ready
        while len(ready) < until_ready:
            count = self._fill_open_pack(queue)
            if not count:
                break
            placed += count
        return placed

    def _fill_open_pack(self, queue: DocumentQueue) -> int:
        """One run of whole documents and the document that fills the open pack (see
        :meth:`place_block`); returns how many documents were placed."""
        refs, tokens, at, count = queue.refs, queue.tokens, queue.at, len(queue.refs)
        if at >= count:
            return 0
        ends = queue.ends()
        if self.open:
            pack = next(iter(self.open.values()))
        else:
            pack = Pack(self.stores)
            self.open_pack(pack)
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
        self.add(refs[last], tokens[last], None)
        queue.at = last + 1
        return last + 1 - at
