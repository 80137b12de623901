"""``"greedy"``: next-fit. One open pack; a document that does not fit closes it.

Documents are never split and keep their order; a document longer than ``max_seq_len`` is
truncated or dropped by the placer's overlong policy before it gets here.
"""

from __future__ import annotations

import bisect

from lightning_tune_data.packing.document_queue import DocumentQueue
from lightning_tune_data.packing.pack import Pack
from lightning_tune_data.packing.pieces import LENGTH_AT, PieceExtra, PieceTokens, Reference
from lightning_tune_data.packing.strategies.base import PackingStrategy, register_strategy

__all__ = ["Greedy"]


@register_strategy
class Greedy(PackingStrategy):
    """Next-fit: the open pack takes the document if it fits, else it is finished and a new one
    opens (see the module docstring)."""

    name = "greedy"

    def add(self, ref: Reference, tokens: PieceTokens, extra: PieceExtra | None) -> None:
        """Append the piece to the open pack, first finishing that pack if the piece does not fit
        (a pack that becomes exactly full is finished at once)."""
        cap, open_packs = self.max_seq_len, self.open
        if open_packs:
            number, pack = next(iter(open_packs.items()))
            if pack.length + ref[LENGTH_AT] > cap:
                self.ready.append(open_packs.pop(number))
        if open_packs:
            number, pack = next(iter(open_packs.items()))
        else:
            pack = Pack(self.stores)
            number = self.open_pack(pack)
        pack.add(ref, tokens, extra)
        if pack.length == cap:
            self.ready.append(open_packs.pop(number))

    def place_block(self, queue: DocumentQueue, until_ready: int) -> int:
        """:meth:`add` over a plain queue until ``until_ready`` packs are finished, planned from the
        documents' cumulative lengths: the run of documents that fit in the open pack is appended
        in one step (one bisect, one list extend); the document after it closes the pack and
        takes the placer's path (which applies the overlong policy). Same packs as :meth:`add`,
        document by document."""
        refs, tokens, count = queue.refs, queue.tokens, len(queue.refs)
        start = at = queue.at
        if at >= count:
            return 0
        ends = queue.ends()
        cap, ready, open_packs, place = self.max_seq_len, self.ready, self.open, self.placer.place
        bisect_right = bisect.bisect_right
        while len(ready) < until_ready and at < count:
            number, pack = next(iter(open_packs.items())) if open_packs else (None, None)
            before = ends[at - 1] if at else 0
            last = bisect_right(ends, before + cap - (pack.length if pack is not None else 0), lo=at)
            if last > at:  # documents at..last-1 fit in the open pack (or a new one)
                if pack is None:
                    pack = Pack(self.stores)
                    number = self.open_pack(pack)
                pack.refs.extend(refs[at:last])
                pack.tokens.extend(tokens[at:last])
                pack.length += ends[last - 1] - before
                at = last
                if pack.length == cap:
                    ready.append(open_packs.pop(number))
                continue
            place(refs[at], tokens[at], None)  # closes the open pack; an overlong document is cut or dropped
            at += 1
        queue.at = at
        return at - start
