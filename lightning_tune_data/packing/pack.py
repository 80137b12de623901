"""One pack of pieces, and the packed sample that materialises it on first access.

A :class:`Pack` keeps its pieces as parallel lists (references, tokens, extras, see
:mod:`~lightning_tune_data.packing.pieces`) and their total length; the packer appends to them
and never changes a piece once it is in. :class:`PackedSample` is what the packer hands out: it
reads like the packed-sample dict, but builds the arrays only when a key is read, so a collator
that knows packs (``PackedCollator``) builds a whole batch from the pieces instead.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from lightning_tune_data.keys import (
    DOCUMENT_IDS,
    IGNORE_INDEX,
    INPUT_IDS,
    LABELS,
    POSITION_IDS,
    PROVENANCE,
    SEQ_LENS,
)
from lightning_tune_data.packing.pieces import (
    LENGTH_AT,
    SOURCE_AT,
    PieceExtra,
    PieceTokens,
    Reference,
    provenance_entry,
)
from lightning_tune_data.packing.rows import write_rows

__all__ = ["Pack", "PackedSample"]


class Pack:
    """The pieces of one pack, in order (references, tokens, extras), and their total length.

    Args:
        stores: by source name, the sources whose flat token arrays the pieces' positions index
            (the placer's, shared by all its packs).
        refs: the first pieces' references (default: none).
        tokens: the first pieces' tokens, in the same order.
        length: the sum of those pieces' lengths.
    """

    __slots__ = ("refs", "tokens", "extras", "length", "stores")

    def __init__(self, stores: Mapping[str, Any] | None = None, refs: list[Reference] | None = None,
                 tokens: list[PieceTokens] | None = None, length: int = 0) -> None:
        self.refs: list[Reference] = [] if refs is None else refs
        self.tokens: list[PieceTokens] = [] if tokens is None else tokens
        # The extras of the first len(extras) pieces (the later ones have none); None while no piece has one.
        self.extras: list[PieceExtra | None] | None = None
        self.length = length  # the sum of the pieces' lengths
        self.stores = stores

    def add(self, ref: Reference, tokens: PieceTokens, extra: PieceExtra | None = None) -> None:
        """Append one piece.

        Args:
            ref: its reference.
            tokens: its tokens (a position or an array).
            extra: its extra, if it has one.
        """
        if extra is not None:
            if self.extras is None:
                self.extras = []
            self.extras += [None] * (len(self.refs) - len(self.extras))
            self.extras.append(extra)
        self.refs.append(ref)
        self.tokens.append(tokens)
        self.length += ref[LENGTH_AT]

    def prefix(self, count: int) -> Pack:
        """A new pack of this pack's first ``count`` pieces (the pack as it was when it held them)."""
        refs = self.refs[:count]
        pack = Pack(self.stores, refs, self.tokens[:count], sum(ref[LENGTH_AT] for ref in refs))
        pack.extras = None if self.extras is None else self.extras[:count]
        return pack

    def pieces(self) -> Iterator[tuple[Reference, PieceTokens, PieceExtra | None]]:
        """Every piece as ``(reference, tokens, extra)``, in order."""
        extras = self.extras or []
        extras = extras + [None] * (len(self.refs) - len(extras))
        return zip(self.refs, self.tokens, extras)

    def to_sample(self) -> dict[str, Any]:
        """The packed sample: every per-token array built with a few vectorised operations."""
        lens = [ref[LENGTH_AT] for ref in self.refs]
        n = self.length
        input_ids = np.empty(n, dtype=np.int64)
        write_rows([self], n, 0, input_ids, lens, [ref[SOURCE_AT] for ref in self.refs])  # one full row: no padding
        ends = np.cumsum(lens)
        labels = np.empty(n, dtype=np.int64)
        labels[:-1] = input_ids[1:]
        labels[ends - 1] = IGNORE_INDEX
        if self.extras is not None:
            for extra, end, length in zip(self.extras, ends.tolist(), lens):
                if extra is not None and extra.labels is not None:
                    labels[end - length : end] = extra.labels
        lens_array = np.asarray(lens, dtype=np.int64)
        return {
            INPUT_IDS: input_ids,
            LABELS: labels,
            POSITION_IDS: np.arange(n, dtype=np.int64) - np.repeat(ends - lens_array, lens_array),
            DOCUMENT_IDS: np.repeat(np.arange(len(lens), dtype=np.int64), lens_array),
            SEQ_LENS: lens,
            PROVENANCE: [provenance_entry(ref) for ref in self.refs],
        }


class PackedSample(Mapping):
    """A packed sample that builds its arrays on first access.

    It reads like the dict :meth:`Pack.to_sample` returns (``input_ids``, ``labels``,
    ``position_ids``, ``document_ids``, ``seq_lens``, ``provenance``); ``PackedCollator`` reads its
    ``pack`` instead and builds a whole batch with a few vectorised operations.

    Args:
        pack: the pack, or the sample's items (a copy rebuilt from them, as
            ``torch.utils.data.default_convert`` does).
    """

    __slots__ = ("pack", "_sample")
    KEYS = (INPUT_IDS, LABELS, POSITION_IDS, DOCUMENT_IDS, SEQ_LENS, PROVENANCE)

    def __init__(self, pack: Pack | Mapping[str, Any]) -> None:
        if isinstance(pack, Pack):
            self.pack: Pack | None = pack
            self._sample: dict[str, Any] | None = None
        else:
            self.pack, self._sample = None, dict(pack)

    def _materialised(self) -> dict[str, Any]:
        if self._sample is None:
            self._sample = self.pack.to_sample()
        return self._sample

    def __getitem__(self, key: str) -> Any:
        return self._materialised()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.KEYS)

    def __len__(self) -> int:
        return len(self.KEYS)

    def __reduce__(self) -> tuple:  # crosses process boundaries as the plain dict
        return (dict, (self._materialised(),))

    def __repr__(self) -> str:
        return f"PackedSample({len(self[INPUT_IDS])} tokens, {len(self[SEQ_LENS])} documents)"
