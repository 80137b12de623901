"""Pieces: a document, or a part of one, as the packer holds it, by reference.

A *piece* is a document, or the part ``[start, start + length)`` of one, placed in a pack. The
packer keeps three things per piece, in parallel lists of its
:class:`~lightning_tune_data.packing.pack.Pack`:

* its *reference*, a plain tuple ``(source, row, epoch, start, length, new_document,
  truncated_tokens, dropped_before)`` (the fields' positions are the ``*_AT`` constants): exactly
  one row of the saved state, so saving a pack is a transpose of its references (``row`` is
  :data:`NOT_REREADABLE` for a document that cannot be re-read);
* its *tokens*: for a document read in a block of an ``ArrowSource``, the position (an ``int``)
  of its first token in that source's flat token array (``flat_tokens()``, found through the
  pack's ``stores`` by the reference's source name; :func:`token_arrays` turns positions into
  views); otherwise a zero-copy view;
* an optional :class:`PieceExtra`: explicit labels (a document with a loss mask) and, for a
  document that cannot be re-read, its loss mask (both travel in the state with its tokens).

No per-token work happens until a pack is materialised. Labels: a piece without explicit labels
is labelled by shifting the pack's tokens by one and writing ``IGNORE_INDEX`` at the piece's last
position (its next token is not in this piece).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np

from lightning_tune_data.keys import (
    DROPPED_BEFORE,
    EPOCH,
    IGNORE_INDEX,
    NEW_DOCUMENT,
    SHARD_BITS,
    SOURCE,
    TOKENS,
    TRUNCATED_TOKENS,
)

__all__ = [
    "DROPPED_AT",
    "EPOCH_AT",
    "LENGTH_AT",
    "NEW_DOCUMENT_AT",
    "NOT_REREADABLE",
    "ROW_AT",
    "SOURCE_AT",
    "START_AT",
    "TRUNCATED_AT",
    "Piece",
    "PieceExtra",
    "PieceTokens",
    "Reference",
    "document_labels",
    "piece_labels",
    "provenance_entry",
    "reference",
    "split_piece",
    "token_arrays",
]

#: ``row`` of a piece whose document cannot be re-read (its tokens travel in the state).
NOT_REREADABLE = -1
#: Positions of the fields in a piece reference.
SOURCE_AT, ROW_AT, EPOCH_AT, START_AT, LENGTH_AT, NEW_DOCUMENT_AT, TRUNCATED_AT, DROPPED_AT = range(8)

#: ``(source, row, epoch, start, length, new_document, truncated_tokens, dropped_before)``.
Reference = tuple
#: A piece's tokens: a position in its source's flat token array, or a view.
PieceTokens = np.ndarray | int


class PieceExtra(NamedTuple):
    """What a piece needs beyond its reference and tokens (most pieces need nothing)."""

    labels: np.ndarray | None  # explicit labels (a masked document); None: the plain shift
    loss_mask: np.ndarray | None  # kept for a document that cannot be re-read (saved with its tokens)


#: One piece: its reference, its tokens and its extra (``None`` for most pieces).
Piece = tuple[Reference, PieceTokens, "PieceExtra | None"]


def reference(source: str, row: int | None, epoch: int, length: int, truncated_tokens: int = 0,
              dropped_before: int = 0) -> Reference:
    """The reference of a whole document.

    Args:
        source: name of the source the document came from.
        row: its row in that source; ``None`` when it cannot be re-read.
        epoch: the source's pass it was read in.
        length: its tokens.
        truncated_tokens: tokens cut from it by the overlong policy.
        dropped_before: overlong documents dropped just before it.
    """
    return (source, NOT_REREADABLE if row is None else int(row), int(epoch), 0, int(length), True,
            int(truncated_tokens), int(dropped_before))


def split_piece(ref: Reference, tokens: PieceTokens, extra: PieceExtra | None, offset: int,
                length: int) -> Piece:
    """The part ``[offset, offset + length)`` of a piece (its last label is ``IGNORE_INDEX``).

    Only the first part keeps the piece's ``new_document``, ``truncated_tokens`` and
    ``dropped_before``: the later parts continue the same document.
    """
    first = offset == 0
    part = (ref[SOURCE_AT], ref[ROW_AT], ref[EPOCH_AT], ref[START_AT] + offset, length, ref[NEW_DOCUMENT_AT] and first,
            ref[TRUNCATED_AT] if first else 0, ref[DROPPED_AT] if first else 0)
    if extra is not None:
        labels, mask = extra
        if labels is not None:
            labels = labels[offset : offset + length].copy()
            labels[-1] = IGNORE_INDEX
        extra = PieceExtra(labels, None if mask is None else mask[offset : offset + length])
    return part, tokens + offset if type(tokens) is int else tokens[offset : offset + length], extra


def token_arrays(refs: list[Reference], tokens: list[PieceTokens], stores: Mapping[str, Any] | None) -> list[np.ndarray]:
    """Every piece's tokens as an array: a position becomes a view into its source's flat token array.

    Args:
        refs: the pieces' references.
        tokens: the pieces' tokens (positions or arrays), in the same order.
        stores: by source name, the sources whose flat token arrays the positions index.
    """
    arrays, flats = [], {}
    for ref, entry in zip(refs, tokens):
        if type(entry) is int:
            flat = flats.get(ref[SOURCE_AT])
            if flat is None:
                flat = flats[ref[SOURCE_AT]] = stores[ref[SOURCE_AT]].flat_tokens()
            entry = flat[entry : entry + ref[LENGTH_AT]]
        arrays.append(entry)
    return arrays


def detach_pieces(holders: Iterable[tuple[Sequence[tuple], list[Any]]], source: str, shards: set[int], flat: Any) -> int:
    """Replace the positions of ``source``'s pieces in ``shards`` with copies of their tokens.

    A source read shard by shard addresses a document as ``shard << SHARD_BITS | position``; once
    it lets go of a shard, the pieces still held of it (in open packs, or in a block read across
    windows and not yet placed) become their own arrays.

    Args:
        holders: ``(references, tokens)`` of each holder: a pack's ``refs`` and ``tokens``, a
            block's ``references()`` and ``tokens`` (the token lists are changed in place).
        source: the source's name.
        shards: the shards let go of.
        flat: the source's ``flat_tokens()`` (slices are arrays).

    Returns:
        How many pieces were copied.
    """
    found = []
    for refs, tokens in holders:
        for index, (ref, entry) in enumerate(zip(refs, tokens)):
            if type(entry) is int and ref[SOURCE_AT] == source and entry >> SHARD_BITS in shards:
                found.append((entry, index, tokens, ref[LENGTH_AT]))
    found.sort(key=lambda piece: piece[0])  # shard by shard: each shard is opened once
    for entry, index, tokens, length in found:
        tokens[index] = np.array(flat[entry : entry + length])
    return len(found)


def document_labels(input_ids: np.ndarray, loss_mask: np.ndarray | None) -> np.ndarray:
    """Shifted labels of one document: the next token where it is a target, ``IGNORE_INDEX``
    elsewhere and at the end.

    Args:
        input_ids: 1-D token ids of the document.
        loss_mask: 1-D bools, ``True`` where the token is a training target; ``None`` = all.
    """
    labels = np.full(len(input_ids), IGNORE_INDEX, dtype=np.int64)
    if len(input_ids) > 1:
        nxt = input_ids[1:]
        labels[:-1] = nxt if loss_mask is None else np.where(loss_mask[1:], nxt, IGNORE_INDEX)
    return labels


def piece_labels(tokens: np.ndarray, extra: PieceExtra | None) -> np.ndarray:
    """A piece's labels as an array: its explicit labels, or the shift within the piece.

    Args:
        tokens: the piece's tokens.
        extra: the piece's extra, if any.
    """
    if extra is not None and extra.labels is not None:
        return extra.labels
    labels = np.full(len(tokens), IGNORE_INDEX, dtype=np.int64)
    labels[:-1] = tokens[1:]
    return labels


def provenance_entry(ref: Reference) -> dict[str, Any]:
    """The per-document provenance of one piece (what a packed sample's ``provenance`` lists).

    Args:
        ref: the piece's reference.
    """
    return {
        SOURCE: ref[SOURCE_AT],
        EPOCH: ref[EPOCH_AT],
        TOKENS: ref[LENGTH_AT],
        NEW_DOCUMENT: ref[NEW_DOCUMENT_AT],
        TRUNCATED_TOKENS: ref[TRUNCATED_AT],
        DROPPED_BEFORE: ref[DROPPED_AT],
    }
