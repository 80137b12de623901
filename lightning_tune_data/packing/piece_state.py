"""Pieces in a saved state: by reference, as plain columns, never token ids.

A state of pieces is a dict of columns with one entry per piece, packs back to back
(:data:`PIECE_COLUMNS`, the fields of a piece reference), plus the sources' names
(:data:`SOURCES`; the ``source`` column holds indexes into it), how many pieces each pack has
(:data:`PACK_PIECES`) and, under :data:`INLINE`, the tokens, labels and loss mask of the few
pieces that cannot be re-read, keyed by their position. Restoring it re-reads every other
document from its source.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from lightning_tune_data.keys import (
    DROPPED_BEFORE,
    EPOCH,
    IGNORE_INDEX,
    INPUT_IDS,
    LABELS,
    LOSS_MASK,
    NEW_DOCUMENT,
    ROW,
    SOURCE,
    TRUNCATED_TOKENS,
)
from lightning_tune_data.packing.pack import Pack
from lightning_tune_data.packing.pieces import (
    NOT_REREADABLE,
    ROW_AT,
    SOURCE_AT,
    Piece,
    PieceExtra,
    PieceTokens,
    Reference,
    document_labels,
    piece_labels,
)

__all__ = [
    "INLINE",
    "PACK_PIECES",
    "PIECE_COLUMNS",
    "SOURCES",
    "DocumentReader",
    "concat_piece_states",
    "held_state",
    "packs_from_state",
    "pending_state",
    "references_to_state",
    "take_pieces",
]

SOURCES = "sources"
PACK_PIECES = "pack_pieces"
INLINE = "inline"
START = "start"
LENGTH = "length"
#: One column per field of a piece reference, in the reference's order.
PIECE_COLUMNS = (SOURCE, ROW, EPOCH, START, LENGTH, NEW_DOCUMENT, TRUNCATED_TOKENS, DROPPED_BEFORE)

#: Reads one document again: ``(source, row, epoch)`` to its sample, ``None`` when it is gone.
DocumentReader = Callable[[str, int, int], "dict[str, Any] | None"]


def references_to_state(refs: list[Reference], pack_pieces: list[int],
                        inline_pieces: Iterable[tuple[int, np.ndarray, PieceExtra | None]] = ()) -> dict[str, Any]:
    """Piece references as the state's columns: one transpose, plain Python values only.

    Args:
        refs: every piece's reference, packs back to back.
        pack_pieces: how many pieces each pack has.
        inline_pieces: ``(position, tokens, extra)`` of the pieces that cannot be re-read.
    """
    columns = [list(column) for column in zip(*refs)] if refs else [[] for _ in PIECE_COLUMNS]
    sources = sorted(set(columns[SOURCE_AT]))
    if len(sources) == 1:
        columns[SOURCE_AT] = [0] * len(refs)
    else:
        index = {name: i for i, name in enumerate(sources)}
        columns[SOURCE_AT] = [index[name] for name in columns[SOURCE_AT]]
    inline = {}
    for position, tokens, extra in inline_pieces:
        inline[str(position)] = {
            INPUT_IDS: np.asarray(tokens).tolist(),
            LOSS_MASK: None if extra is None or extra.loss_mask is None else extra.loss_mask.tolist(),
            LABELS: piece_labels(tokens, extra).tolist(),
        }
    state: dict[str, Any] = {SOURCES: sources, PACK_PIECES: list(pack_pieces)}
    state.update(zip(PIECE_COLUMNS, columns))
    state[INLINE] = inline
    return state


def held_state(packs: list[Pack], counts: list[int]) -> dict[str, Any]:
    """The state of ``packs`` as they were when each held ``counts[i]`` pieces (packs only grow
    by appending, so a prefix is the pack of that moment).

    Args:
        packs: the held packs, in the order they are saved.
        counts: each pack's pieces at the moment saved.
    """
    held = list(zip(packs, counts))
    refs = [ref for pack, count in held for ref in pack.refs[:count]]
    inline = []
    if any(ref[ROW_AT] == NOT_REREADABLE for ref in refs):
        position = 0
        for pack, count in held:
            for ref, tokens, extra in itertools.islice(pack.pieces(), count):
                if ref[ROW_AT] == NOT_REREADABLE:
                    inline.append((position, tokens, extra))
                position += 1
    return references_to_state(refs, [count for _, count in held], inline)


def pending_state(refs: list[Reference], tokens: list[PieceTokens], extras: list[PieceExtra | None] | None,
                  at: int) -> dict[str, Any]:
    """The state of documents read but not placed yet (from position ``at``), as one pack.

    Args:
        refs: the queued documents' references.
        tokens: their tokens.
        extras: their extras (``None``: a plain block, every document re-readable).
        at: the first document not placed.
    """
    refs = refs[at:]
    inline = []
    if extras is not None:  # loaded from a state: may hold pieces that can't be re-read
        inline = [(i, piece_tokens, extra) for i, (ref, piece_tokens, extra) in
                  enumerate(zip(refs, tokens[at:], extras[at:])) if ref[ROW_AT] == NOT_REREADABLE]
    return references_to_state(refs, [len(refs)], inline)


def concat_piece_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """The pieces of several states (shards) as one state with one pack per piece, in order.

    Args:
        states: piece states, each with its own source names.
    """
    sources = sorted({name for state in states for name in state[SOURCES]})
    index = {name: i for i, name in enumerate(sources)}
    merged: dict[str, Any] = {SOURCES: sources, PACK_PIECES: [], INLINE: {}, **{c: [] for c in PIECE_COLUMNS}}
    for state in states:
        offset = len(merged[ROW])
        count = len(state[ROW])
        for column in PIECE_COLUMNS:
            values = state[column]
            if column == SOURCE:
                merged[column].extend(index[state[SOURCES][v]] for v in values)
            else:
                merged[column].extend(values)
        for key, value in state[INLINE].items():
            merged[INLINE][str(offset + int(key))] = value
        merged[PACK_PIECES].extend([1] * count)
    return merged


def take_pieces(state: dict[str, Any], shard_id: int, num_shards: int) -> dict[str, Any]:
    """Pieces ``shard_id::num_shards`` of a merged piece state (one pack per piece).

    Args:
        state: the merged piece state.
        shard_id: this shard.
        num_shards: every shard.
    """
    chosen = list(range(len(state[ROW])))[shard_id::num_shards]
    taken: dict[str, Any] = {SOURCES: state[SOURCES], PACK_PIECES: [1] * len(chosen), INLINE: {}}
    for column in PIECE_COLUMNS:
        taken[column] = [state[column][i] for i in chosen]
    for new, old in enumerate(chosen):
        if str(old) in state[INLINE]:
            taken[INLINE][str(new)] = state[INLINE][str(old)]
    return taken


def packs_from_state(state: dict[str, Any], read_document: DocumentReader, owner: str) -> list[Pack]:
    """The packs of a piece state, every re-readable document read again from its source.

    Args:
        state: the piece state.
        read_document: reads one document again (the packer's child's ``read_document``).
        owner: name of the packer restoring them (for error messages).
    """
    packs, index = [], 0
    for count in state[PACK_PIECES]:
        pack = Pack()
        for _ in range(int(count)):
            pack.add(*_piece_from_state(state, index, read_document, owner))
            index += 1
        packs.append(pack)
    return packs


def _piece_from_state(state: dict[str, Any], index: int, read_document: DocumentReader, owner: str) -> Piece:
    source = state[SOURCES][state[SOURCE][index]]
    row, epoch = int(state[ROW][index]), int(state[EPOCH][index])
    start, length = int(state[START][index]), int(state[LENGTH][index])
    inline = state[INLINE].get(str(index))
    if inline is not None:
        ids = np.asarray(inline[INPUT_IDS], dtype=np.int64)
        labels = np.asarray(inline[LABELS], dtype=np.int64)
        mask = None if inline[LOSS_MASK] is None else np.asarray(inline[LOSS_MASK], dtype=bool)
        extra, row = PieceExtra(labels, mask), NOT_REREADABLE
    else:
        document = read_document(source, row, epoch)
        if document is None or len(document[INPUT_IDS]) < start + length:
            raise ValueError(
                f"Packer '{owner}': the saved state holds tokens {start}..{start + length} of row "
                f"{row} of source '{source}' (pass {epoch}), which the source can no longer provide. The data "
                "changed since the checkpoint; restore it, or resume with `resume_data_state: false`."
            )
        full_ids = np.asarray(document[INPUT_IDS])
        if full_ids.dtype.kind not in "iu":
            full_ids = full_ids.astype(np.int64)
        full_mask = document.get(LOSS_MASK)
        ids, extra = full_ids[start : start + length], None
        if full_mask is not None:
            labels = document_labels(full_ids, np.asarray(full_mask, dtype=bool))[start : start + length]
            labels[-1] = IGNORE_INDEX
            extra = PieceExtra(labels, None)
    ref = (source, row, epoch, start, length, bool(state[NEW_DOCUMENT][index]),
           int(state[TRUNCATED_TOKENS][index]), int(state[DROPPED_BEFORE][index]))
    return ref, ids, extra
