"""Pieces and packs of the packer, their bulk materialisation, and their by-reference state.

A *piece* is a document, or the part ``[start, start + length)`` of one, placed in a pack. It
holds a zero-copy view of its tokens (into the memory-mapped cache for an ``ArrowSource``) and
only the bookkeeping needed to label it and to find it again: no per-token work happens until a
pack is materialised, and then it is a handful of vectorised operations per pack.

Labels: a piece without a loss mask is labelled by shifting the pack's tokens by one and
writing ``-100`` at the piece's last position (its next token is not in this piece); only a piece
with a loss mask carries an explicit ``labels`` array.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from lightning_tune_data.streams.base import DROPPED_BEFORE, EPOCH, INPUT_IDS, LOSS_MASK, SOURCE, TRUNCATED_TOKENS

IGNORE_INDEX = -100

# Keys of the by-reference pack state (one list entry per piece, in pack order).
SOURCES = "sources"
PACK_PIECES = "pack_pieces"
PIECE_COLUMNS = ("source", "row", "epoch", "start", "length", "new_document", "truncated_tokens", "dropped_before")
INLINE = "inline"


class Piece:
    """A document, or the part ``[start, start + length)`` of one, placed in a pack.

    ``row is None`` means the document cannot be re-read from its source: its tokens travel in
    the state instead (``loss_mask`` is kept for that). ``labels is None`` means the plain shift
    (no loss mask).
    """

    __slots__ = ("input_ids", "labels", "source", "epoch", "row", "start", "new_document", "truncated_tokens",
                 "dropped_before", "loss_mask", "length", "_reference")

    def __init__(self, input_ids: np.ndarray, labels: np.ndarray | None, source: str, epoch: int, row: int | None,
                 start: int = 0, new_document: bool = True, truncated_tokens: int = 0, dropped_before: int = 0,
                 loss_mask: np.ndarray | None = None) -> None:
        self.input_ids = input_ids
        self.labels = labels
        self.source = source
        self.epoch = epoch
        self.row = row
        self.start = start
        self.new_document = new_document
        self.truncated_tokens = truncated_tokens
        self.dropped_before = dropped_before
        self.loss_mask = loss_mask
        self.length = len(input_ids)
        self._reference: tuple | None = None

    def reference(self) -> tuple:
        """``(source, row, epoch, start, length, new_document, truncated_tokens, dropped_before)``,
        plain Python values (``row`` -1 when it cannot be re-read); computed once."""
        if self._reference is None:
            self._reference = (self.source, -1 if self.row is None else int(self.row), int(self.epoch),
                               int(self.start), self.length, bool(self.new_document), int(self.truncated_tokens),
                               int(self.dropped_before))
        return self._reference

    def __len__(self) -> int:
        return self.length

    def part(self, offset: int, length: int) -> Piece:
        """The sub-piece ``[offset, offset + length)`` of this piece (its last label is ``-100``)."""
        labels = None
        if self.labels is not None:
            labels = self.labels[offset : offset + length].copy()
            labels[-1] = IGNORE_INDEX
        mask = None if self.loss_mask is None else self.loss_mask[offset : offset + length]
        first = offset == 0
        return Piece(self.input_ids[offset : offset + length], labels, self.source, self.epoch, self.row,
                     self.start + offset, self.new_document and first, self.truncated_tokens if first else 0,
                     self.dropped_before if first else 0, mask)

    def full_labels(self) -> np.ndarray:
        """This piece's labels as an array (the shift within the piece when there is no mask)."""
        if self.labels is not None:
            return self.labels
        labels = np.full(self.length, IGNORE_INDEX, dtype=np.int64)
        labels[:-1] = self.input_ids[1:]
        return labels

    def provenance(self) -> dict[str, Any]:
        return {
            SOURCE: self.source,
            EPOCH: self.epoch,
            "tokens": self.length,
            "new_document": self.new_document,
            TRUNCATED_TOKENS: self.truncated_tokens,
            DROPPED_BEFORE: self.dropped_before,
        }


class Pack:
    """The pieces of one pack, in order, and their total length."""

    __slots__ = ("pieces", "length")

    def __init__(self) -> None:
        self.pieces: list[Piece] = []
        self.length = 0

    def add(self, piece: Piece) -> None:
        self.pieces.append(piece)
        self.length += piece.length

    def to_sample(self) -> dict[str, Any]:
        """The packed sample: every per-token array built with a few vectorised operations."""
        pieces = self.pieces
        lens = [p.length for p in pieces]
        n = self.length
        input_ids = np.concatenate([p.input_ids for p in pieces], dtype=np.int64, casting="same_kind")
        ends = np.cumsum(lens)
        labels = np.empty(n, dtype=np.int64)
        labels[:-1] = input_ids[1:]
        labels[ends - 1] = IGNORE_INDEX
        if any(p.labels is not None for p in pieces):
            for piece, end in zip(pieces, ends.tolist()):
                if piece.labels is not None:
                    labels[end - piece.length : end] = piece.labels
        lens_array = np.asarray(lens, dtype=np.int64)
        return {
            INPUT_IDS: input_ids,
            "labels": labels,
            "position_ids": np.arange(n, dtype=np.int64) - np.repeat(ends - lens_array, lens_array),
            "document_ids": np.repeat(np.arange(len(lens), dtype=np.int64), lens_array),
            "seq_lens": lens,
            "provenance": [p.provenance() for p in pieces],
        }


class PackedSample(Mapping):
    """A packed sample that builds its arrays on first access.

    It reads like the dict :meth:`Pack.to_sample` returns (``input_ids``, ``labels``,
    ``position_ids``, ``document_ids``, ``seq_lens``, ``provenance``); ``PackedCollator`` reads its
    ``pieces`` instead and builds a whole batch with a few vectorised operations.
    """

    __slots__ = ("pack", "_sample")
    KEYS = (INPUT_IDS, "labels", "position_ids", "document_ids", "seq_lens", "provenance")

    def __init__(self, pack: Pack | Mapping[str, Any]) -> None:
        if isinstance(pack, Pack):
            self.pack: Pack | None = pack
            self._sample: dict[str, Any] | None = None
        else:  # rebuilt from its items (``torch.utils.data.default_convert`` does that)
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
        return f"PackedSample({len(self[INPUT_IDS])} tokens, {len(self['seq_lens'])} documents)"


def pieces_to_state(packs: list[Pack]) -> dict[str, Any]:
    """Packs as plain lists of piece references (a few integers per piece, never token ids,
    except for pieces that cannot be re-read). Runs after every batch: column-wise, no per-piece
    work beyond one cached tuple."""
    pieces = [piece for pack in packs for piece in pack.pieces]
    columns = [list(column) for column in zip(*(p.reference() for p in pieces))] or [[] for _ in PIECE_COLUMNS]
    sources = sorted(set(columns[0]))
    index = {name: i for i, name in enumerate(sources)}
    columns[0] = [index[name] for name in columns[0]]
    inline = {}
    if -1 in columns[1]:
        for position, piece in enumerate(pieces):
            if piece.row is None:
                inline[str(position)] = {
                    INPUT_IDS: np.asarray(piece.input_ids).tolist(),
                    LOSS_MASK: None if piece.loss_mask is None else piece.loss_mask.tolist(),
                    "labels": piece.full_labels().tolist(),
                }
    state: dict[str, Any] = {SOURCES: sources, PACK_PIECES: [len(pack.pieces) for pack in packs]}
    state.update(zip(PIECE_COLUMNS, columns))
    state[INLINE] = inline
    return state


def concat_piece_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """The pieces of several states (shards) as one state with one pack per piece, in order."""
    sources = sorted({name for state in states for name in state[SOURCES]})
    index = {name: i for i, name in enumerate(sources)}
    merged: dict[str, Any] = {SOURCES: sources, PACK_PIECES: [], INLINE: {}, **{c: [] for c in PIECE_COLUMNS}}
    for state in states:
        offset = len(merged["row"])
        count = len(state["row"])
        for column in PIECE_COLUMNS:
            values = state[column]
            if column == "source":
                merged[column].extend(index[state[SOURCES][v]] for v in values)
            else:
                merged[column].extend(values)
        for key, value in state[INLINE].items():
            merged[INLINE][str(offset + int(key))] = value
        merged[PACK_PIECES].extend([1] * count)
    return merged


def take_pieces(state: dict[str, Any], shard_id: int, num_shards: int) -> dict[str, Any]:
    """Pieces ``shard_id::num_shards`` of a merged piece state (one pack per piece)."""
    chosen = list(range(len(state["row"])))[shard_id::num_shards]
    taken: dict[str, Any] = {SOURCES: state[SOURCES], PACK_PIECES: [1] * len(chosen), INLINE: {}}
    for column in PIECE_COLUMNS:
        taken[column] = [state[column][i] for i in chosen]
    for new, old in enumerate(chosen):
        if str(old) in state[INLINE]:
            taken[INLINE][str(new)] = state[INLINE][str(old)]
    return taken


def document_labels(input_ids: np.ndarray, loss_mask: np.ndarray | None) -> np.ndarray:
    """Shifted labels of one document: next token where it is a target, ``-100`` elsewhere and at the end.

    Args:
        input_ids: 1-D token ids of the document.
        loss_mask: 1-D bools, ``True`` where the token is a training target; ``None`` = all.
    """
    labels = np.full(len(input_ids), IGNORE_INDEX, dtype=np.int64)
    if len(input_ids) > 1:
        nxt = input_ids[1:]
        labels[:-1] = nxt if loss_mask is None else np.where(loss_mask[1:], nxt, IGNORE_INDEX)
    return labels
