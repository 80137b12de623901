"""Collators: the label contract, the padding contract, packing layout and provenance.

Labels are already shifted: the label at position ``i`` is the target predicted at ``i``
(``input_ids[i + 1]`` of the same document), ``-100`` at document ends, padding and masked
prompt tokens. The tests spell out every position of small batches.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
import torch

from lightning_tune_data.collate import (
    ATTENTION_MASK,
    DOCUMENT_IDS,
    IGNORE_INDEX,
    INPUT_IDS,
    LABELS,
    POSITION_IDS,
    PROVENANCE,
    SEQ_LENS,
    PackedCollator,
    PaddedCollator,
    shifted_labels,
)

PAD = 99
X = IGNORE_INDEX  # short alias for "no target" in expected arrays


def doc(ids: list[int], source: str = "a", epoch: int = 0, mask: list[bool] | None = None) -> dict[str, Any]:
    """A document sample as the stream yields it."""
    sample: dict[str, Any] = {"input_ids": np.asarray(ids, dtype=np.int32), "source": source, "epoch": epoch}
    if mask is not None:
        sample["loss_mask"] = np.asarray(mask, dtype=bool)
    return sample


def pack(documents: list[dict[str, Any]], new_document: list[bool] | None = None) -> dict[str, Any]:
    """A packed sample built the way the packer must: labels shifted per document, then joined."""
    flags = new_document or [True] * len(documents)
    ids = [np.asarray(d["input_ids"], dtype=np.int32) for d in documents]
    return {
        "input_ids": np.concatenate(ids),
        "labels": np.concatenate([shifted_labels(i, d.get("loss_mask")) for i, d in zip(ids, documents)]),
        "position_ids": np.concatenate([np.arange(len(i)) for i in ids]),
        "document_ids": np.concatenate([np.full(len(i), k) for k, i in enumerate(ids)]),
        "seq_lens": [len(i) for i in ids],
        "provenance": [
            {"source": d["source"], "epoch": d["epoch"], "tokens": len(i), "new_document": flag}
            for d, i, flag in zip(documents, ids, flags)
        ],
    }


def rows(tensor: torch.Tensor) -> list[list[int]]:
    return tensor.tolist()


# ----------------------------------------------------------------------------- shifted_labels


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


# ----------------------------------------------------------------------------- PaddedCollator


def test_padded_collator_lays_out_every_position_of_labels_and_padding() -> None:
    batch = PaddedCollator(pad_id=PAD)([doc([1, 2, 3], "a", 0), doc([4, 5, 6, 7, 8], "b", 2)])
    assert rows(batch[INPUT_IDS]) == [[1, 2, 3, PAD, PAD], [4, 5, 6, 7, 8]]
    assert rows(batch[LABELS]) == [[2, 3, X, X, X], [5, 6, 7, 8, X]]
    assert rows(batch[ATTENTION_MASK]) == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert rows(batch[POSITION_IDS]) == [[0, 1, 2, 0, 0], [0, 1, 2, 3, 4]]


def test_padded_collator_outputs_long_tensors_of_batch_by_length() -> None:
    batch = PaddedCollator(pad_id=PAD)([doc([1, 2]), doc([3, 4, 5]), doc([6])])
    for key in (INPUT_IDS, LABELS, ATTENTION_MASK, POSITION_IDS):
        assert batch[key].dtype == torch.long, key
        assert tuple(batch[key].shape) == (3, 3), key
    assert set(batch) == {INPUT_IDS, LABELS, ATTENTION_MASK, POSITION_IDS, PROVENANCE}


def test_padded_collator_masks_prompt_tokens_out_of_the_labels() -> None:
    prompt_answer = doc([1, 2, 3, 4, 5], mask=[False, False, False, True, True])
    batch = PaddedCollator(pad_id=PAD)([prompt_answer, doc([6, 7])])
    assert rows(batch[LABELS]) == [[X, X, 4, 5, X], [7, X, X, X, X]]
    assert rows(batch[INPUT_IDS])[0] == [1, 2, 3, 4, 5]  # the prompt is still model input


def test_padded_collator_padding_positions_hold_pad_id_and_ignored_labels() -> None:
    batch = PaddedCollator(pad_id=PAD, pad_to_multiple_of=4)([doc([1]), doc([2, 3, 4, 5, 6])])
    padding = batch[ATTENTION_MASK] == 0
    assert padding.sum().item() == 7 + 3
    assert (batch[INPUT_IDS][padding] == PAD).all()
    assert (batch[LABELS][padding] == X).all()
    assert (batch[POSITION_IDS][padding] == 0).all()


@pytest.mark.parametrize(("longest", "multiple", "expected"), [(5, 8, 8), (8, 8, 8), (9, 8, 16), (3, 1, 3)])
def test_padded_collator_rounds_length_up_to_pad_to_multiple_of(longest: int, multiple: int, expected: int) -> None:
    batch = PaddedCollator(pad_id=PAD, pad_to_multiple_of=multiple)([doc(list(range(longest))), doc([1])])
    assert tuple(batch[INPUT_IDS].shape) == (2, expected)
    assert rows(batch[LABELS])[0] == list(range(1, longest)) + [X] * (expected - longest + 1)


def test_padded_collator_truncates_documents_longer_than_max_seq_len() -> None:
    batch = PaddedCollator(pad_id=PAD, max_seq_len=4)([doc([1, 2, 3, 4, 5, 6]), doc([7, 8])])
    assert rows(batch[INPUT_IDS]) == [[1, 2, 3, 4], [7, 8, PAD, PAD]]
    # the last kept token has no target inside the row
    assert rows(batch[LABELS]) == [[2, 3, 4, X], [8, X, X, X]]
    assert batch[PROVENANCE]["tokens"] == [4, 2]


def test_padded_collator_truncates_the_loss_mask_with_the_document() -> None:
    long_prompt = doc([1, 2, 3, 4, 5, 6], mask=[False, True, True, False, True, True])
    batch = PaddedCollator(pad_id=PAD, max_seq_len=4)([long_prompt])
    assert rows(batch[LABELS]) == [[2, 3, X, X]]


def test_padded_collator_reports_provenance_per_document() -> None:
    samples = [doc([1, 2, 3], "wiki", 1), doc([4], "code", 0), doc([5, 6], "wiki", 2)]
    batch = PaddedCollator(pad_id=PAD)(samples)
    assert batch[PROVENANCE] == {
        "source": ["wiki", "code", "wiki"],
        "epoch": [1, 0, 2],
        "tokens": [3, 1, 2],
        "row": [0, 1, 2],
        "new_document": [True, True, True],
        "truncated_tokens": [0, 0, 0],
        "dropped_before": [0, 0, 0],
    }
    assert all(type(v) is int for v in batch[PROVENANCE]["tokens"] + batch[PROVENANCE]["epoch"])


def test_padded_collator_ignores_extra_sample_keys_and_accepts_lists() -> None:
    sample = {"input_ids": [1, 2], "source": "a", "epoch": 0, "text": "raw", "id": 17}
    batch = PaddedCollator(pad_id=PAD)([sample])
    assert rows(batch[INPUT_IDS]) == [[1, 2]]


def test_padded_collator_output_does_not_alias_the_input_arrays() -> None:
    sample = doc([1, 2, 3])
    batch = PaddedCollator(pad_id=PAD)([sample])
    batch[INPUT_IDS][0, 0] = 42
    assert sample["input_ids"].tolist() == [1, 2, 3]


def test_padded_collator_missing_source_raises_naming_the_field() -> None:
    with pytest.raises(ValueError, match="sample 1 has no 'source' field"):
        PaddedCollator(pad_id=PAD)([doc([1]), {"input_ids": np.array([2]), "epoch": 0}])


def test_padded_collator_loss_mask_of_wrong_length_raises() -> None:
    bad = doc([1, 2, 3])
    bad["loss_mask"] = np.array([True, False])
    with pytest.raises(ValueError, match="3 input_ids but 2 loss_mask entries"):
        PaddedCollator(pad_id=PAD)([bad])


def test_padded_collator_rejects_non_integer_or_2d_input_ids() -> None:
    collator = PaddedCollator(pad_id=PAD)
    with pytest.raises(ValueError, match="must hold integers"):
        collator([{"input_ids": np.array([1.5, 2.0]), "source": "a", "epoch": 0}])
    with pytest.raises(ValueError, match="must be a 1-D array"):
        collator([{"input_ids": np.ones((2, 2), dtype=np.int64), "source": "a", "epoch": 0}])


def test_padded_collator_rejects_an_empty_batch() -> None:
    with pytest.raises(ValueError, match="empty list"):
        PaddedCollator(pad_id=PAD)([])


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


def test_padded_collator_works_as_a_dataloader_collate_fn() -> None:
    documents = [doc([i] * (i + 1), source=f"s{i % 2}") for i in range(6)]
    loader = torch.utils.data.DataLoader(documents, batch_size=3, collate_fn=PaddedCollator(pad_id=PAD))
    batches = list(loader)
    assert [tuple(b[INPUT_IDS].shape) for b in batches] == [(3, 3), (3, 6)]
    assert batches[1][PROVENANCE]["source"] == ["s1", "s0", "s1"]


def reference_padded_batch(
    samples: list[dict[str, Any]], pad_id: int, max_seq_len: int | None, pad_to_multiple_of: int | None
) -> dict[str, Any]:
    """The padded batch written out row by row and token by token (what PaddedCollator must produce)."""
    documents = []
    for sample in samples:
        ids = [int(t) for t in np.asarray(sample["input_ids"]).astype(np.int64)]
        mask = sample.get("loss_mask")
        mask = None if mask is None else [bool(m) for m in np.asarray(mask)]
        cut = sample.get("truncated_tokens") or 0
        if max_seq_len is not None and len(ids) > max_seq_len:
            cut += len(ids) - max_seq_len
            ids, mask = ids[:max_seq_len], None if mask is None else mask[:max_seq_len]
        labels = [ids[i + 1] if mask is None or mask[i + 1] else X for i in range(len(ids) - 1)] + [X] * bool(ids)
        documents.append((ids, labels, sample, cut))
    longest = max(len(ids) for ids, _, _, _ in documents)
    width = longest if pad_to_multiple_of is None else -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    padding = [width - len(ids) for ids, _, _, _ in documents]
    return {
        INPUT_IDS: [ids + [pad_id] * p for (ids, _, _, _), p in zip(documents, padding)],
        LABELS: [labels + [X] * p for (_, labels, _, _), p in zip(documents, padding)],
        ATTENTION_MASK: [[1] * len(ids) + [0] * p for (ids, _, _, _), p in zip(documents, padding)],
        POSITION_IDS: [list(range(len(ids))) + [0] * p for (ids, _, _, _), p in zip(documents, padding)],
        PROVENANCE: {
            "source": [str(s["source"]) for _, _, s, _ in documents],
            "epoch": [int(s["epoch"]) for _, _, s, _ in documents],
            "tokens": [len(ids) for ids, _, _, _ in documents],
            "row": list(range(len(documents))),
            "new_document": [True] * len(documents),
            "truncated_tokens": [cut for _, _, _, cut in documents],
            "dropped_before": [s.get("dropped_before") or 0 for _, _, s, _ in documents],
        },
    }


def random_document_samples(rng: np.random.Generator, masks: bool, counts: bool) -> list[dict[str, Any]]:
    """A batch of 1..9 documents: lengths 0, 1, 2 or up to 40 tokens, mixed integer dtypes, lists."""
    samples = []
    for index in range(int(rng.integers(1, 10))):
        n = int(rng.choice([0, 1, 2, int(rng.integers(3, 41))]))
        dtype = rng.choice([np.int32, np.int64, np.uint16, np.uint32])
        ids: Any = rng.integers(0, 60_000, n).astype(dtype)
        if rng.random() < 0.1:
            ids = ids.tolist()
        sample: dict[str, Any] = {"input_ids": ids, "source": f"s{index % 3}", "epoch": int(rng.integers(0, 4))}
        if masks and rng.random() < 0.6:
            sample["loss_mask"] = rng.random(n) < 0.6
        if counts and rng.random() < 0.4:
            sample["truncated_tokens"] = int(rng.integers(0, 5))
        if counts and rng.random() < 0.4:
            sample["dropped_before"] = int(rng.integers(0, 3))
        samples.append(sample)
    return samples


@pytest.mark.parametrize("masks", [False, True], ids=["no-mask", "loss-mask"])
@pytest.mark.parametrize("counts", [False, True], ids=["plain", "length-counts"])
@pytest.mark.parametrize(
    ("max_seq_len", "pad_to_multiple_of"), [(None, None), (None, 8), (1, None), (5, None), (17, 4), (40, 64)]
)
def test_padded_collator_matches_a_row_by_row_reference_bit_for_bit(
    masks: bool, counts: bool, max_seq_len: int | None, pad_to_multiple_of: int | None
) -> None:
    rng = np.random.default_rng([int(masks), int(counts), max_seq_len or 0, pad_to_multiple_of or 0])
    collator = PaddedCollator(pad_id=PAD, max_seq_len=max_seq_len, pad_to_multiple_of=pad_to_multiple_of)
    for _ in range(40):
        samples = random_document_samples(rng, masks, counts)
        batch = collator(samples)
        expected = reference_padded_batch(samples, PAD, max_seq_len, pad_to_multiple_of)
        for key in (INPUT_IDS, LABELS, ATTENTION_MASK, POSITION_IDS):
            assert batch[key].dtype == torch.int64
            assert rows(batch[key]) == expected[key], key
        assert batch[PROVENANCE] == expected[PROVENANCE]
        # the four [B, L] outputs are consecutive planes of one block (a worker sends it as one segment)
        keys = (INPUT_IDS, LABELS, ATTENTION_MASK, POSITION_IDS)
        plane = batch[INPUT_IDS].numel() * 8
        assert [batch[key].data_ptr() - batch[INPUT_IDS].data_ptr() for key in keys] == [0, plane, 2 * plane, 3 * plane]


def test_padded_collator_writes_every_batch_of_only_empty_or_one_token_documents() -> None:
    collator = PaddedCollator(pad_id=PAD)
    empty = collator([doc([]), doc([])])
    assert tuple(empty[INPUT_IDS].shape) == (2, 0) and empty[PROVENANCE]["tokens"] == [0, 0]
    single = PaddedCollator(pad_id=PAD, pad_to_multiple_of=4)([doc([5]), doc([])])
    assert rows(single[INPUT_IDS]) == [[5, PAD, PAD, PAD], [PAD] * 4]
    assert rows(single[LABELS]) == [[X] * 4, [X] * 4]
    assert rows(single[ATTENTION_MASK]) == [[1, 0, 0, 0], [0] * 4]


def test_padded_collator_keeps_exact_ids_when_integer_dtypes_do_not_share_a_type() -> None:
    big = np.array([2**63 + 5, 7], dtype=np.uint64)  # wraps to int64 exactly like an element-wise cast
    exact = np.array([2**53 + 1, 2**62 + 3], dtype=np.int64)  # would lose bits through float64
    batch = PaddedCollator(pad_id=PAD)([{**doc([]), "input_ids": big}, {**doc([]), "input_ids": exact}])
    assert rows(batch[INPUT_IDS]) == [big.astype(np.int64).tolist(), exact.tolist()]
    assert rows(batch[LABELS]) == [[7, X], [2**62 + 3, X]]


def test_padded_collator_reads_an_integer_loss_mask_as_true_or_false() -> None:
    as_bool = doc([1, 2, 3, 4], mask=[False, True, False, True])
    as_int = {**as_bool, "loss_mask": np.array([0, 1, 0, 1], dtype=np.int8)}
    collator = PaddedCollator(pad_id=PAD)
    assert rows(collator([as_int])[LABELS]) == rows(collator([as_bool])[LABELS]) == [[2, X, 4, X]]


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"input_ids": np.array([1.5, 2.0])}, "sample 2 field 'input_ids' must hold integers"),
        ({"input_ids": np.array([True, False])}, "sample 2 field 'input_ids' must hold integers"),
        ({"input_ids": np.ones((2, 2), dtype=np.int64)}, r"sample 2 field 'input_ids' must be a 1-D array"),
        ({"input_ids": np.int64(3)}, r"sample 2 field 'input_ids' must be a 1-D array"),
        ({"input_ids": "tokens"}, r"sample 2 field 'input_ids' must be a 1-D array"),
        ({"input_ids": None}, r"sample 2 field 'input_ids' must be a 1-D array"),
        ({"epoch": None}, None),
        ({"dropped_before": -2}, "sample 2 field 'dropped_before' must be a non-negative int"),
        ({"truncated_tokens": 1.5}, "sample 2 field 'truncated_tokens' must be a non-negative int"),
    ],
)
def test_padded_collator_names_the_bad_sample_among_good_ones(bad: dict[str, Any], message: str | None) -> None:
    samples = [doc([1, 2]), doc([3]), {**doc([4, 5, 6]), **bad}, doc([7])]
    if message is None:  # int(None): the same TypeError as before
        with pytest.raises(TypeError):
            PaddedCollator(pad_id=PAD)(samples)
        return
    with pytest.raises(ValueError, match=message):
        PaddedCollator(pad_id=PAD)(samples)


def test_padded_collator_rejects_a_batch_of_only_2d_token_arrays() -> None:
    samples = [{**doc([]), "input_ids": np.ones((1, 3), dtype=np.int32)} for _ in range(3)]
    with pytest.raises(ValueError, match="sample 0 field 'input_ids' must be a 1-D array"):
        PaddedCollator(pad_id=PAD)(samples)


def test_padded_collator_reads_strided_and_mixed_dtype_token_arrays_like_plain_ones() -> None:
    tokens = np.arange(20, dtype=np.int32)
    strided = [{**doc([]), "input_ids": tokens[::3]}, doc([5, 6])]
    mixed = [{**doc([]), "input_ids": np.array([7, 8, 9], dtype=np.uint16)}, {**doc([]), "input_ids": np.array([1], dtype=np.int64)}]
    collator = PaddedCollator(pad_id=PAD)
    assert rows(collator(strided)[INPUT_IDS]) == [[0, 3, 6, 9, 12, 15, 18], [5, 6, PAD, PAD, PAD, PAD, PAD]]
    assert rows(collator(mixed)[INPUT_IDS]) == [[7, 8, 9], [1, PAD, PAD]]
    assert rows(collator(mixed)[LABELS]) == [[8, 9, X], [X, X, X]]


def test_padded_collator_pickles_small_after_wide_batches() -> None:
    collator = PaddedCollator(pad_id=PAD)
    collator([doc(list(range(5000))), doc([1])])  # grows its per-width caches
    restored = pickle.loads(pickle.dumps(collator))
    assert len(pickle.dumps(collator)) < 1000  # the caches are rebuilt in the worker, not shipped
    assert rows(restored([doc([3, 4]), doc([5])])[LABELS]) == [[4, X], [X, X]]



def test_padded_collator_batches_cross_a_worker_process_in_one_shared_storage() -> None:
    documents = [doc(list(range(i + 1)), source=f"s{i % 2}") for i in range(6)]
    collator = PaddedCollator(pad_id=PAD, pad_to_multiple_of=4)
    in_process = [collator(documents[i : i + 3]) for i in (0, 3)]
    loader = torch.utils.data.DataLoader(documents, batch_size=3, num_workers=1, collate_fn=collator)
    keys = (INPUT_IDS, LABELS, ATTENTION_MASK, POSITION_IDS)
    for expected, batch in zip(in_process, loader, strict=True):
        outputs = [batch[key] for key in keys]
        assert all(torch.equal(output, expected[key]) for output, key in zip(outputs, keys))
        assert all(output.is_shared() for output in outputs)
        assert len({output.untyped_storage().data_ptr() for output in outputs}) == 1
        assert batch[PROVENANCE] == expected[PROVENANCE]

# ----------------------------------------------------------------------------- PackedCollator


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
    }


def test_padded_collator_carries_length_policy_counts_and_adds_its_own_cut() -> None:
    cut_by_stream = dict(doc([1, 2, 3], "wiki"), truncated_tokens=5, dropped_before=2)
    cut_here = doc([4, 5, 6, 7, 8, 9], "code")  # 6 tokens, max_seq_len 4: the safety net cuts 2
    batch = PaddedCollator(pad_id=PAD, max_seq_len=4)([cut_by_stream, cut_here, doc([1], "wiki")])
    assert batch[PROVENANCE]["truncated_tokens"] == [5, 2, 0]
    assert batch[PROVENANCE]["dropped_before"] == [2, 0, 0]


def test_packed_collator_carries_length_policy_counts_per_piece() -> None:
    row0 = pack([doc([1, 2, 3], "wiki"), doc([4], "code")])
    row0["provenance"][0].update(truncated_tokens=7)
    row0["provenance"][1].update(dropped_before=3)
    batch = PackedCollator(pad_id=PAD)([row0, pack([doc([5, 6], "code")])])
    assert batch[PROVENANCE]["truncated_tokens"] == [7, 0, 0]
    assert batch[PROVENANCE]["dropped_before"] == [0, 3, 0]


def test_collators_reject_a_negative_truncation_count() -> None:
    sample = dict(doc([1, 2]), truncated_tokens=-1)
    with pytest.raises(ValueError, match="'truncated_tokens' must be a non-negative int"):
        PaddedCollator(pad_id=PAD)([sample])


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
