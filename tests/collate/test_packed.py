"""``PackedCollator``: the packing layout of every field, provenance flattened over rows, and the
checks on packed samples.
"""

from __future__ import annotations

import pytest
import torch
from collate_samples import PAD, X, doc, pack, rows

from lightning_tune_data.collate import (
    ATTENTION_MASK,
    DOCUMENT_IDS,
    INPUT_IDS,
    LABELS,
    POSITION_IDS,
    PROVENANCE,
    SEQ_LENS,
    PackedCollator,
    PaddedCollator,
)


def test_packed_collator_lays_out_every_position_and_pads_each_field() -> None:
    row0 = pack([doc([1, 2, 3], "a", 0), doc([4, 5], "b", 1)])
    row1 = pack([doc([6, 7], "a", 0), doc([8], "c", 0), doc([9], "b", 3)])
    batch = PackedCollator(pad_id=PAD)([row0, pack([doc([10, 11, 12], "a", 1)]), row1])
    assert rows(batch[INPUT_IDS]) == [[1, 2, 3, 4, 5], [10, 11, 12, PAD, PAD], [6, 7, 8, 9, PAD]]
    assert rows(batch[LABELS]) == [[2, 3, X, 5, X], [11, 12, X, X, X], [7, X, X, X, X]]
    assert rows(batch[POSITION_IDS]) == [[0, 1, 2, 0, 1], [0, 1, 2, 0, 0], [0, 1, 0, 0, 0]]
    assert rows(batch[DOCUMENT_IDS]) == [[0, 0, 0, 1, 1], [0, 0, 0, -1, -1], [0, 0, 1, 2, -1]]
    assert rows(batch[ATTENTION_MASK]) == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0]]
    assert rows(batch[SEQ_LENS]) == [[3, 2, 0], [3, 0, 0], [2, 1, 1]]


def test_packed_collator_outputs_long_tensors_with_documents_dimension() -> None:
    batch = PackedCollator(pad_id=PAD, pad_to_multiple_of=8)(
        [pack([doc([1, 2]), doc([3])]), pack([doc([4, 5, 6, 7])])]
    )
    for key in (INPUT_IDS, LABELS, POSITION_IDS, DOCUMENT_IDS, ATTENTION_MASK):
        assert batch[key].dtype == torch.long, key
        assert tuple(batch[key].shape) == (2, 8), key
    assert batch[SEQ_LENS].dtype == torch.long and tuple(batch[SEQ_LENS].shape) == (2, 2)
    assert set(batch) == {INPUT_IDS, LABELS, POSITION_IDS, DOCUMENT_IDS, ATTENTION_MASK, SEQ_LENS, PROVENANCE}


def test_packed_collator_keeps_prompt_masking_from_the_pack() -> None:
    prompt_answer = doc([1, 2, 3, 4], mask=[False, False, True, True])
    batch = PackedCollator(pad_id=PAD)([pack([prompt_answer, doc([5, 6])])])
    assert rows(batch[LABELS]) == [[X, 3, 4, X, 6, X]]


def test_packed_collator_padding_positions_hold_pad_id_and_ignored_labels() -> None:
    batch = PackedCollator(pad_id=PAD, pad_to_multiple_of=4)([pack([doc([1, 2]), doc([3])])])
    assert rows(batch[INPUT_IDS]) == [[1, 2, 3, PAD]]
    assert rows(batch[LABELS]) == [[2, X, X, X]]
    assert rows(batch[POSITION_IDS]) == [[0, 1, 0, 0]]
    assert rows(batch[DOCUMENT_IDS]) == [[0, 0, 1, -1]]
    assert rows(batch[ATTENTION_MASK]) == [[1, 1, 1, 0]]


def test_packed_collator_flattens_provenance_over_rows() -> None:
    row0 = pack([doc([1, 2, 3], "wiki", 2), doc([4], "code", 0)], new_document=[False, True])
    row1 = pack([doc([5, 6], "code", 1)])
    batch = PackedCollator(pad_id=PAD)([row0, row1])
    assert batch[PROVENANCE] == {
        "source": ["wiki", "code", "code"],
        "epoch": [2, 0, 1],
        "tokens": [3, 1, 2],
        "row": [0, 0, 1],
        "new_document": [False, True, True],
        "truncated_tokens": [0, 0, 0],
        "dropped_before": [0, 0, 0],
        "target_tokens": [2, 0, 1],
    }


def test_packed_collator_counts_each_pieces_target_labels_and_zero_for_an_all_prompt_piece() -> None:
    all_prompt = doc([1, 2, 3], "sft", mask=[False, False, False])
    first_token_only = doc([4, 5], "sft", mask=[True, False])  # the first token is never predicted
    answer = doc([6, 7, 8, 9], "sft", mask=[False, False, True, True])
    batch = PackedCollator(pad_id=PAD, pad_to_multiple_of=8)([pack([all_prompt, answer]), pack([first_token_only])])
    targets = batch[PROVENANCE]["target_tokens"]
    assert targets == [0, 2, 0]
    labels = batch[LABELS]
    per_piece = [int((labels[0, :3] != X).sum()), int((labels[0, 3:7] != X).sum()), int((labels[1, :2] != X).sum())]
    assert targets == per_piece


def test_packed_collator_carries_length_policy_counts_per_piece() -> None:
    row0 = pack([doc([1, 2, 3], "wiki"), doc([4], "code")])
    row0["provenance"][0].update(truncated_tokens=7)
    row0["provenance"][1].update(dropped_before=3)
    batch = PackedCollator(pad_id=PAD)([row0, pack([doc([5, 6], "code")])])
    assert batch[PROVENANCE]["truncated_tokens"] == [7, 0, 0]
    assert batch[PROVENANCE]["dropped_before"] == [0, 3, 0]


def test_packed_collator_rejects_a_pack_longer_than_max_seq_len() -> None:
    with pytest.raises(ValueError, match="longer than max_seq_len=4.*same max_seq_len"):
        PackedCollator(pad_id=PAD, max_seq_len=4)([pack([doc([1, 2, 3]), doc([4, 5])])])


def test_packed_collator_rejects_seq_lens_that_do_not_cover_the_pack() -> None:
    sample = pack([doc([1, 2, 3]), doc([4, 5])])
    sample["seq_lens"] = [3, 1]
    with pytest.raises(ValueError, match="seq_lens=\\[3, 1\\] sum to 4, but the pack has 5 tokens"):
        PackedCollator(pad_id=PAD)([sample])


def test_packed_collator_rejects_provenance_not_matching_the_documents() -> None:
    sample = pack([doc([1, 2, 3]), doc([4, 5])])
    sample["provenance"] = sample["provenance"][:1]
    with pytest.raises(ValueError, match="2 seq_lens but 1 provenance entries"):
        PackedCollator(pad_id=PAD)([sample])
    sample = pack([doc([1, 2, 3])])
    del sample["provenance"][0]["new_document"]
    with pytest.raises(ValueError, match="provenance entry without \\['new_document'\\]"):
        PackedCollator(pad_id=PAD)([sample])


def test_packed_collator_rejects_per_token_fields_of_different_lengths() -> None:
    sample = pack([doc([1, 2, 3])])
    sample["labels"] = sample["labels"][:2]
    with pytest.raises(ValueError, match="field 'labels' has length 2 but input_ids has length 3"):
        PackedCollator(pad_id=PAD)([sample])


def test_packed_collator_given_document_samples_points_to_the_padded_collator() -> None:
    with pytest.raises(ValueError, match="no 'labels' field.*PaddedCollator"):
        PackedCollator(pad_id=PAD)([doc([1, 2, 3])])
