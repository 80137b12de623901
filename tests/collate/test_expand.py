"""``expand_batch``: a compact batch written by hand, expanded field by field; other batches pass through."""

from __future__ import annotations

import pytest
import torch

from lightning_tune_data.collate import IGNORE_INDEX, expand_batch
from lightning_tune_data.collate.expand import _EXPANSIONS, is_compact
from lightning_tune_data.keys import COMPACT_LAYOUT, INPUT_IDS, PROVENANCE, ROW_LENGTHS, SEQ_LENS, TARGET_MASK

X = IGNORE_INDEX


def test_a_packed_batch_gets_labels_positions_documents_and_mask_from_its_lengths() -> None:
    batch = {
        COMPACT_LAYOUT: "packed",
        INPUT_IDS: torch.tensor([[1, 2, 3, 4, 5, 9], [6, 7, 8, 9, 9, 9]], dtype=torch.int32),
        SEQ_LENS: torch.tensor([[2, 3], [3, 0]]),
        PROVENANCE: {"source": ["a", "b", "a"]},
    }
    full = expand_batch(batch)
    on_device = _EXPANSIONS["packed"][0](batch)
    assert all(torch.equal(on_device[key], full[key]) for key in list(full)[:6])
    assert list(full) == ["input_ids", "labels", "position_ids", "document_ids", "attention_mask", "seq_lens",
                          "provenance"]
    assert all(full[key].dtype == torch.int64 for key in list(full)[:6])
    assert full["input_ids"].tolist() == [[1, 2, 3, 4, 5, 9], [6, 7, 8, 9, 9, 9]]
    assert full["labels"].tolist() == [[2, X, 4, 5, X, X], [7, 8, X, X, X, X]]
    assert full["position_ids"].tolist() == [[0, 1, 0, 1, 2, 0], [0, 1, 2, 0, 0, 0]]
    assert full["document_ids"].tolist() == [[0, 0, 1, 1, 1, -1], [0, 0, 0, -1, -1, -1]]
    assert full["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]]
    assert full["provenance"] is batch[PROVENANCE]


def test_a_target_mask_decides_which_labels_are_targets() -> None:
    batch = {
        COMPACT_LAYOUT: "packed",
        INPUT_IDS: torch.tensor([[1, 2, 3, 4]], dtype=torch.int32),
        SEQ_LENS: torch.tensor([[4]]),
        TARGET_MASK: torch.tensor([[False, True, True, False]]),
        PROVENANCE: {},
    }
    assert expand_batch(batch)["labels"].tolist() == _EXPANSIONS["packed"][0](batch)["labels"].tolist() == [[X, 3, 4, X]]


def test_a_padded_batch_gets_labels_positions_and_mask_from_its_row_lengths() -> None:
    batch = {
        COMPACT_LAYOUT: "padded",
        INPUT_IDS: torch.tensor([[1, 2, 3], [4, 0, 0]], dtype=torch.int32),
        ROW_LENGTHS: torch.tensor([3, 1]),
        PROVENANCE: {"source": ["a", "b"]},
    }
    full = expand_batch(batch)
    on_device = _EXPANSIONS["padded"][0](batch)
    assert all(torch.equal(on_device[key], full[key]) for key in list(full)[:4])
    assert list(full) == ["input_ids", "labels", "attention_mask", "position_ids", "provenance"]
    assert full["labels"].tolist() == [[2, 3, X], [X, X, X]]
    assert full["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert full["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]


def test_batches_that_are_not_compact_pass_through_and_an_unknown_layout_is_an_error() -> None:
    full = {INPUT_IDS: torch.zeros(1, 2, dtype=torch.long)}
    assert expand_batch(full) is full and not is_compact(full) and not is_compact([1, 2])
    assert expand_batch([1, 2]) == [1, 2]
    with pytest.raises(ValueError, match="unknown compact layout 'ragged'"):
        expand_batch({COMPACT_LAYOUT: "ragged"})
