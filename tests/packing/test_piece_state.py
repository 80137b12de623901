"""Pieces in a saved state: columns by reference, inline tokens only for what cannot be re-read."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lightning_tune_data.keys import IGNORE_INDEX
from lightning_tune_data.packing.pack import Pack
from lightning_tune_data.packing.piece_state import (
    INLINE,
    PACK_PIECES,
    PIECE_COLUMNS,
    SOURCES,
    concat_piece_states,
    held_state,
    packs_from_state,
    pending_state,
    references_to_state,
    take_pieces,
)
from lightning_tune_data.packing.pieces import PieceExtra, reference, split_piece

DOCUMENTS = {("a", 0): np.arange(10, 16), ("b", 4): np.arange(40, 43)}


def _read(source: str, row: int, epoch: int) -> dict | None:
    tokens = DOCUMENTS.get((source, row))
    return None if tokens is None else {"input_ids": tokens, "loss_mask": np.array([True] * len(tokens))}


def _packs() -> list[Pack]:
    first, second = Pack(), Pack()
    piece = split_piece(reference("a", 0, 1, 6), DOCUMENTS[("a", 0)], None, 2, 4)
    first.add(*piece)
    stream_tokens = np.array([7, 8])
    first.add(reference("stream", None, 0, 2), stream_tokens, PieceExtra(np.array([8, IGNORE_INDEX]),
                                                                        np.array([False, True])))
    second.add(reference("b", 4, 0, 3, truncated_tokens=5), DOCUMENTS[("b", 4)])
    return [first, second]


def test_references_become_columns_with_source_indexes():
    refs = [reference("b", 1, 0, 3), reference("a", 2, 1, 4), reference("b", 5, 0, 1)]
    state = references_to_state(refs, [2, 1])
    assert state[SOURCES] == ["a", "b"] and state["source"] == [1, 0, 1]
    assert state[PACK_PIECES] == [2, 1] and state["row"] == [1, 2, 5] and state["length"] == [3, 4, 1]
    assert set(state) == {SOURCES, PACK_PIECES, INLINE, *PIECE_COLUMNS} and state[INLINE] == {}
    one_source = references_to_state([reference("a", 1, 0, 3)], [1])
    assert one_source[SOURCES] == ["a"] and one_source["source"] == [0]
    assert references_to_state([], [])["row"] == []


def test_held_packs_are_saved_as_their_prefixes_with_only_unreadable_pieces_inline():
    packs = _packs()
    state = held_state(packs, [2, 0])
    assert state[PACK_PIECES] == [2, 0] and state["row"] == [0, -1] and state["start"] == [2, 0]
    assert state[INLINE] == {"1": {"input_ids": [7, 8], "loss_mask": [False, True], "labels": [8, IGNORE_INDEX]}}
    assert json.loads(json.dumps(state)) == state


def test_pending_documents_are_saved_from_the_first_not_placed():
    refs = [reference("a", row, 0, 2) for row in range(3)] + [reference("stream", None, 0, 2)]
    tokens = [np.arange(2)] * 4
    state = pending_state(refs, tokens, [None] * 4, 1)
    assert state[PACK_PIECES] == [3] and state["row"] == [1, 2, -1] and list(state[INLINE]) == ["2"]
    assert pending_state(refs[:3], tokens[:3], None, 2)[INLINE] == {}


def test_packs_come_back_with_their_documents_read_again():
    packs = _packs()
    restored = packs_from_state(held_state(packs, [2, 1]), _read, "packed")
    assert [pack.refs for pack in restored] == [pack.refs for pack in packs]
    assert [pack.length for pack in restored] == [6, 3]
    assert restored[0].tokens[0].tolist() == [12, 13, 14, 15]
    # a re-read document with a loss mask gets explicit labels; the piece's last one is ignored
    assert restored[0].extras[0].labels.tolist() == [13, 14, 15, IGNORE_INDEX]
    assert restored[0].tokens[1].tolist() == [7, 8] and restored[0].extras[1].loss_mask.tolist() == [False, True]


def test_a_document_the_source_no_longer_has_is_a_clear_error():
    state = references_to_state([reference("a", 9, 0, 3)], [1])
    with pytest.raises(ValueError, match=r"Packer 'packed'.*row 9 of source 'a'.*resume_data_state: false"):
        packs_from_state(state, _read, "packed")


@pytest.mark.parametrize("num_shards", [1, 2, 3])
def test_merged_pieces_are_handed_to_the_new_shards_exactly_once(num_shards):
    first = held_state(_packs(), [2, 1])
    second = references_to_state([reference("c", 3, 0, 2), reference("stream", None, 0, 1)], [2],
                                  [(1, np.array([5]), None)])
    merged = concat_piece_states([first, second])
    assert merged[SOURCES] == ["a", "b", "c", "stream"] and merged[PACK_PIECES] == [1] * 5
    assert sorted(merged[INLINE]) == ["1", "4"]
    taken = [take_pieces(merged, shard, num_shards) for shard in range(num_shards)]
    pieces = sorted((t[SOURCES][s], row) for t in taken for s, row in zip(t["source"], t["row"]))
    assert pieces == sorted((merged[SOURCES][s], row) for s, row in zip(merged["source"], merged["row"]))
    inline = [value["input_ids"] for t in taken for value in t[INLINE].values()]
    assert sorted(inline) == [[5], [7, 8]]
    for t in taken:  # an inline piece keeps its tokens at its new position
        for position in t[INLINE]:
            assert t["row"][int(position)] == -1
