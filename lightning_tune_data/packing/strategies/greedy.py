"""``"greedy"``: next-fit. One open pack; a document that does not fit closes it.

Documents are never split and keep their order; a document longer than ``max_seq_len`` is
truncated or dropped by the placer's overlong policy before it gets here.
"""

from __future__ import annotations

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
