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
        """:meth:`add` over a plain queue until ``until_ready`` packs are finished, planned from the
        documents' cumulative lengths: each pack takes the run of whole documents that fit (one
        bisect, one list extend), then the document that fills it is cut inline (it may fill
        several packs). Same packs, pieces and pack numbers as :meth:`add`, document by document."""
        refs, tokens, count = queue.refs, queue.tokens, len(queue.refs)
        start = at = queue.at
        if at >= count:
            return 0
        ends = queue.ends()
        cap, ready, open_packs, stores = self.max_seq_len, self.ready, self.open, self.stores
        bisect_left = bisect.bisect_left
        number, pack = next(iter(open_packs.items())) if open_packs else (0, None)
        while len(ready) < until_ready:
            if pack is None:  # as add() does: a document that finds no open pack opens one
                pack = Pack(stores)
                number = self.open_pack(pack)
            before = ends[at - 1] if at else 0
            last = bisect_left(ends, before + cap - pack.length, lo=at)  # the document that fills the pack
            if last >= count:  # every queued document fits with room to spare
                pack.refs.extend(refs[at:])
                pack.tokens.extend(tokens[at:])
                pack.length += ends[-1] - before
                at = count
                break
            if last > at:
                pack.refs.extend(refs[at:last])
                pack.tokens.extend(tokens[at:last])
                pack.length += ends[last - 1] - before
            ref, position = refs[last], tokens[last]
            n = ref[LENGTH_AT]
            offset = 0
            while offset < n:  # add()'s loop for the document that fills the pack, pieces cut inline
                room, take = cap - pack.length, n - offset
                if room < take:
                    take = room
                if take == n:
                    pack.refs.append(ref)
                    pack.tokens.append(position)
                elif type(position) is int:  # split_piece inlined for a position
                    pack.refs.append((ref[0], ref[1], ref[2], ref[3] + offset, take, False, 0, 0) if offset
                                     else ref[:LENGTH_AT] + (take,) + ref[LENGTH_AT + 1 :])
                    pack.tokens.append(position + offset)
                else:
                    piece, piece_tokens, _ = split_piece(ref, position, None, offset, take)
                    pack.refs.append(piece)
                    pack.tokens.append(piece_tokens)
                pack.length += take
                offset += take
                if take == room:  # the pack is full: it is finished, the next one opens (open_pack inlined)
                    ready.append(open_packs.pop(number))
                    pack = Pack(stores)
                    number = self.next_number
                    self.next_number = number + 1
                    open_packs[number] = pack
            at = last + 1
            if pack.length == 0:  # the document ended exactly at a pack's end: no pack stays open
                del open_packs[number]
                pack = None
            if at >= count:
                break
        queue.at = at
        return at - start
