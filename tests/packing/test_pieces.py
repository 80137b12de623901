"""Pieces: references, splitting a piece, token views from positions, labels and provenance."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_tune_data.keys import IGNORE_INDEX, PROVENANCE_FIELDS
from lightning_tune_data.packing.pieces import (
    NOT_REREADABLE,
    PieceExtra,
    document_labels,
    piece_labels,
    provenance_entry,
    reference,
    split_piece,
    token_arrays,
)


class _Store:
    """A source's flat token array, as block reading indexes it."""

    def __init__(self, flat: np.ndarray) -> None:
        self.flat = flat

    def flat_tokens(self) -> np.ndarray:
        return self.flat


def test_a_reference_is_a_plain_tuple_of_a_whole_document():
    assert reference("web", np.int64(7), np.int64(1), np.int64(30), 4, 2) == ("web", 7, 1, 0, 30, True, 4, 2)
    assert all(type(value) in (str, int, bool) for value in reference("web", np.int64(7), 1, 30))
    assert reference("stream", None, 0, 5)[1] == NOT_REREADABLE


def test_only_the_first_part_of_a_split_piece_keeps_the_documents_flags():
    ref = reference("web", 3, 0, 10, truncated_tokens=4, dropped_before=2)
    labels = np.arange(100, 110)
    extra = PieceExtra(labels, np.ones(10, dtype=bool))
    first, first_tokens, first_extra = split_piece(ref, 500, extra, 0, 6)
    second, second_tokens, second_extra = split_piece(ref, 500, extra, 6, 4)
    assert first == ("web", 3, 0, 0, 6, True, 4, 2) and first_tokens == 500
    assert second == ("web", 3, 0, 6, 4, False, 0, 0) and second_tokens == 506  # a position moves by the offset
    assert first_extra.labels.tolist() == [100, 101, 102, 103, 104, IGNORE_INDEX]  # no label crosses the cut
    assert second_extra.labels.tolist() == [106, 107, 108, IGNORE_INDEX]  # nor the end of any part
    assert labels[5] == 105  # the document's labels are not changed
    assert len(first_extra.loss_mask) == 6 and len(second_extra.loss_mask) == 4


def test_a_split_view_is_a_view_and_a_plain_piece_stays_plain():
    tokens = np.arange(10)
    _, part, extra = split_piece(reference("s", 0, 0, 10), tokens, None, 2, 5)
    assert part.tolist() == [2, 3, 4, 5, 6] and np.shares_memory(part, tokens) and extra is None


def test_token_positions_become_views_into_their_sources_flat_arrays():
    stores = {"a": _Store(np.arange(100)), "b": _Store(np.arange(1000, 1100))}
    refs = [reference("a", 0, 0, 3), reference("b", 0, 0, 2), reference("c", None, 0, 2)]
    arrays = token_arrays(refs, [10, 50, np.array([7, 8])], stores)
    assert [array.tolist() for array in arrays] == [[10, 11, 12], [1050, 1051], [7, 8]]
    assert np.shares_memory(arrays[0], stores["a"].flat)


@pytest.mark.parametrize(
    ("ids", "mask", "labels"),
    [
        ([5, 6, 7, 8], None, [6, 7, 8, IGNORE_INDEX]),
        ([5, 6, 7, 8], [True, False, True, False], [IGNORE_INDEX, 7, IGNORE_INDEX, IGNORE_INDEX]),
        ([5], None, [IGNORE_INDEX]),
    ],
)
def test_document_labels_are_the_next_target_token(ids, mask, labels):
    mask = None if mask is None else np.array(mask)
    assert document_labels(np.array(ids), mask).tolist() == labels


def test_a_piece_without_explicit_labels_is_labelled_by_the_shift_within_it():
    tokens = np.array([3, 4, 5])
    assert piece_labels(tokens, None).tolist() == [4, 5, IGNORE_INDEX]
    explicit = np.array([IGNORE_INDEX, 5, IGNORE_INDEX])
    assert piece_labels(tokens, PieceExtra(explicit, None)) is explicit
    assert piece_labels(tokens, PieceExtra(None, np.ones(3, dtype=bool))).tolist() == [4, 5, IGNORE_INDEX]


def test_a_pieces_provenance_has_every_per_document_field_but_the_row_and_the_target_count():
    entry = provenance_entry(("web", 3, 1, 6, 4, False, 0, 2))
    assert entry == {"source": "web", "epoch": 1, "tokens": 4, "new_document": False, "truncated_tokens": 0,
                     "dropped_before": 2}
    # the collator numbers the rows and counts each piece's targets from the labels it writes
    assert set(entry) == set(PROVENANCE_FIELDS) - {"row", "target_tokens"}


def test_detach_pieces_copies_out_only_the_named_sources_pieces_in_the_let_go_shards():
    import numpy as np

    from lightning_tune_data.keys import SHARD_BITS
    from lightning_tune_data.packing.pack import Pack
    from lightning_tune_data.packing.pieces import detach_pieces

    flat = np.arange(100, dtype=np.int32)
    tokens_of = {0: 5, 1: (1 << SHARD_BITS) + 7, 2: (2 << SHARD_BITS) + 9}

    class Slices:  # positions of three shards over one array: shard k's token i is at k * 10 + i
        def __getitem__(self, key: slice) -> np.ndarray:
            start = (key.start >> SHARD_BITS) * 10 + (key.start & ((1 << SHARD_BITS) - 1))
            return flat[start : start + key.stop - key.start]

    pack = Pack()
    for shard, position in tokens_of.items():
        pack.add(("web", shard, 0, 0, 3, True, 0, 0), position)
    pack.add(("code", 9, 0, 0, 3, True, 0, 0), 1 << SHARD_BITS)  # another source's position stays
    assert detach_pieces([(pack.refs, pack.tokens)], "web", {1, 2}, Slices()) == 2
    assert pack.tokens[0] == 5 and pack.tokens[3] == 1 << SHARD_BITS
    assert pack.tokens[1].tolist() == [17, 18, 19] and pack.tokens[2].tolist() == [29, 30, 31]
