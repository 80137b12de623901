"""What both collators share: the label contract (``shifted_labels``) and their argument checks.

Labels are already shifted: the label at position ``i`` is the target predicted at ``i``
(``input_ids[i + 1]`` of the same document), ``-100`` at document ends, padding and masked
prompt tokens. The tests spell out every position of small documents.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
import torch
from collate_samples import PAD, X, doc, pack

from lightning_tune_data.collate import (
    ATTENTION_MASK,
    DOCUMENT_IDS,
    INPUT_IDS,
    LABELS,
    POSITION_IDS,
    PackedCollator,
    PaddedCollator,
    shifted_labels,
)
from lightning_tune_data.collate.base import (
    CACHED_WIDTH,
    ArangeCache,
    checked_collator_options,
    count_field,
    one_d_array,
    padded_length,
    required_field,
)


def test_shifted_labels_target_the_next_token_and_ignore_the_document_end() -> None:
    labels = shifted_labels(np.array([10, 11, 12, 13]), None)
    assert labels.dtype == np.int64
    assert labels.tolist() == [11, 12, 13, X]


def test_shifted_labels_ignore_positions_whose_next_token_is_masked_prompt() -> None:
    ids = np.array([10, 11, 12, 13, 14])
    mask = np.array([False, False, True, True, True])  # two prompt tokens, three answer tokens
    assert shifted_labels(ids, mask).tolist() == [X, 12, 13, 14, X]


def test_shifted_labels_of_a_single_token_document_is_ignored() -> None:
    assert shifted_labels(np.array([7]), None).tolist() == [X]


def test_shifted_labels_of_an_empty_document_is_empty() -> None:
    labels = shifted_labels(np.array([], dtype=np.int64), None)
    assert labels.shape == (0,) and labels.dtype == np.int64


def test_shifted_labels_do_not_modify_their_inputs() -> None:
    ids = np.array([1, 2, 3])
    mask = np.array([True, False, True])
    shifted_labels(ids, mask)
    assert ids.tolist() == [1, 2, 3] and mask.tolist() == [True, False, True]


def test_shifted_labels_reject_a_mask_of_another_length() -> None:
    with pytest.raises(ValueError, match="loss_mask has shape"):
        shifted_labels(np.array([1, 2, 3]), np.array([True, True]))


def test_shifted_labels_never_cross_a_document_boundary_in_a_packed_row() -> None:
    rng = np.random.default_rng(0)
    documents = []
    for k in range(40):
        n = int(rng.integers(1, 12))
        mask = rng.random(n) < 0.7 if k % 3 == 0 else None
        documents.append(doc(rng.integers(0, 50, n).tolist(), mask=None if mask is None else mask.tolist()))
    batch = PackedCollator(pad_id=PAD)([pack(documents[:25]), pack(documents[25:])])

    def crossing_labels(ids: np.ndarray, labels: np.ndarray, document_ids: np.ndarray) -> int:
        """Number of targets that are not the next token of the same document."""
        targets = np.flatnonzero(labels != X)
        assert targets.size > 0 and (targets + 1 < ids.shape[0]).all()
        same_document = document_ids[targets + 1] == document_ids[targets]
        next_token = labels[targets] == ids[targets + 1]
        return int((~(same_document & next_token)).sum())

    for row in range(2):
        ids = batch[INPUT_IDS][row].numpy()
        labels = batch[LABELS][row].numpy()
        document_ids = batch[DOCUMENT_IDS][row].numpy()
        assert crossing_labels(ids, labels, document_ids) == 0
        # the last token of every document has no target
        real = document_ids >= 0
        last_of_document = np.flatnonzero(real & (np.append(document_ids[1:], -1) != document_ids))
        assert (labels[last_of_document] == X).all()
        # control: shifting the whole row at once (the bug this guards against) is caught
        n = int(real.sum())
        whole_row = np.full_like(labels, X)
        whole_row[:n] = shifted_labels(ids[:n], None)
        assert crossing_labels(ids, whole_row, document_ids) > 0


@pytest.mark.parametrize(
    "kwargs", [{"max_seq_len": 0}, {"pad_to_multiple_of": -8}, {"pad_id": None}]
)
def test_collators_reject_invalid_arguments_naming_them(kwargs: dict[str, Any]) -> None:
    arguments = {"pad_id": PAD, **kwargs}
    name = next(iter(kwargs))
    for cls in (PaddedCollator, PackedCollator):
        with pytest.raises(ValueError, match=name):
            cls(**arguments)


def test_collators_survive_a_pickle_round_trip_and_behave_the_same() -> None:
    padded = PaddedCollator(pad_id=PAD, max_seq_len=8, pad_to_multiple_of=4)
    packed = PackedCollator(pad_id=PAD, max_seq_len=8, pad_to_multiple_of=4)
    docs = [doc([1, 2, 3]), doc([4, 5])]
    for collator, samples in ((padded, docs), (packed, [pack(docs)])):
        restored = pickle.loads(pickle.dumps(collator))
        expected, actual = collator(samples), restored(samples)
        assert repr(restored) == repr(collator)
        for key in (INPUT_IDS, LABELS, ATTENTION_MASK, POSITION_IDS):
            assert torch.equal(expected[key], actual[key])


def test_collators_reject_a_negative_truncation_count() -> None:
    sample = dict(doc([1, 2]), truncated_tokens=-1)
    with pytest.raises(ValueError, match="'truncated_tokens' must be a non-negative int"):
        PaddedCollator(pad_id=PAD)([sample])


# ----------------------------------------------------------------------------- shared checks
def test_collate_exports_the_batch_and_provenance_keys_defined_once_in_keys() -> None:
    import lightning_tune_data.collate as collate
    from lightning_tune_data import keys

    for name in ("ATTENTION_MASK", "DOCUMENT_IDS", "DROPPED_BEFORE", "EPOCH", "IGNORE_INDEX", "INPUT_IDS", "LABELS",
                 "LOSS_MASK", "NEW_DOCUMENT", "PAD_DOCUMENT_ID", "POSITION_IDS", "PROVENANCE", "ROW", "SEQ_LENS",
                 "SOURCE", "TOKENS", "TRUNCATED_TOKENS"):
        assert getattr(collate, name) == getattr(keys, name), name
        assert name in collate.__all__


def test_checked_collator_options_accept_positive_ints_and_none_and_name_a_bad_one() -> None:
    assert checked_collator_options("C", np.int64(7), None, 8) == (7, None, 8)
    for pad_id, max_seq_len, multiple, field in ((True, None, None, "pad_id"), (0, 0, None, "max_seq_len"),
                                                  (0, None, 2.0, "pad_to_multiple_of")):
        with pytest.raises(ValueError, match=rf"^C: {field} must be"):
            checked_collator_options("C", pad_id, max_seq_len, multiple)


@pytest.mark.parametrize(("longest", "multiple", "expected"), [(5, None, 5), (5, 4, 8), (8, 4, 8), (0, 4, 0)])
def test_padded_length_rounds_up_to_the_multiple(longest: int, multiple: int | None, expected: int) -> None:
    assert padded_length(longest, multiple) == expected


def test_one_d_array_returns_a_1d_integer_array_as_is_and_names_sample_and_key_otherwise() -> None:
    ids = np.arange(3, dtype=np.int32)
    assert one_d_array("C", 0, "input_ids", ids) is ids
    assert one_d_array("C", 0, "input_ids", [1, 2]).tolist() == [1, 2]
    assert one_d_array("C", 0, "loss_mask", [0.5], integer=False).dtype == np.float64
    with pytest.raises(ValueError, match=r"C: sample 2 field 'input_ids' must be a 1-D array, got shape \(1, 2\)"):
        one_d_array("C", 2, "input_ids", [[1, 2]])
    with pytest.raises(ValueError, match=r"C: sample 1 field 'input_ids' must hold integers, got dtype float64"):
        one_d_array("C", 1, "input_ids", [1.5])


def test_required_and_count_fields_name_the_sample_and_the_field() -> None:
    sample = {"source": "a", "truncated_tokens": 3, "dropped_before": -1}
    assert required_field("C", 0, sample, "source", "why.") == "a"
    with pytest.raises(ValueError, match=r"C: sample 4 has no 'epoch' field \(keys: \[.*\]\); why\."):
        required_field("C", 4, sample, "epoch", "why.")
    assert count_field("C", 0, sample, "truncated_tokens") == 3
    assert count_field("C", 0, sample, "missing") == 0
    with pytest.raises(ValueError, match=r"C: sample 0 field 'dropped_before' must be a non-negative int"):
        count_field("C", 0, sample, "dropped_before")


def test_arange_cache_hands_out_views_of_one_array_and_pickles_empty() -> None:
    arange = ArangeCache()
    first, second = arange(5), arange(3)
    assert first.tolist() == [0, 1, 2, 3, 4] and second.tolist() == [0, 1, 2]
    assert np.shares_memory(first, second) and len(arange(CACHED_WIDTH)) == CACHED_WIDTH
    assert arange(CACHED_WIDTH + 1)[-1] == CACHED_WIDTH  # regrown for a wider batch
    assert pickle.loads(pickle.dumps(arange))._values is None
