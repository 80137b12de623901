"""``PaddedCollator``: one document per row, every position of labels and padding spelled out,
provenance per document, and a row-by-row reference it matches bit for bit.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
import torch
from collate_samples import PAD, X, doc, rows

from lightning_tune_data.collate import (
    ATTENTION_MASK,
    INPUT_IDS,
    LABELS,
    POSITION_IDS,
    PROVENANCE,
    PaddedCollator,
)


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
        "target_tokens": [2, 0, 1],
    }
    assert all(type(v) is int for v in batch[PROVENANCE]["tokens"] + batch[PROVENANCE]["epoch"])


def test_padded_collator_counts_target_labels_per_row_and_zero_when_truncation_cut_the_answer() -> None:
    prompt_then_answer = doc([1, 2, 3, 4, 5], "sft", mask=[False, False, False, True, True])
    batch = PaddedCollator(pad_id=PAD, max_seq_len=3)([prompt_then_answer, doc([6, 7, 8], "web")])
    assert batch[PROVENANCE]["target_tokens"] == [0, 2]
    assert batch[PROVENANCE]["target_tokens"] == (batch[LABELS] != X).sum(dim=1).tolist()


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
            "target_tokens": [sum(label != X for label in labels) for _, labels, _, _ in documents],
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


def test_padded_collator_carries_length_policy_counts_and_adds_its_own_cut() -> None:
    cut_by_stream = dict(doc([1, 2, 3], "wiki"), truncated_tokens=5, dropped_before=2)
    cut_here = doc([4, 5, 6, 7, 8, 9], "code")  # 6 tokens, max_seq_len 4: the safety net cuts 2
    batch = PaddedCollator(pad_id=PAD, max_seq_len=4)([cut_by_stream, cut_here, doc([1], "wiki")])
    assert batch[PROVENANCE]["truncated_tokens"] == [5, 2, 0]
    assert batch[PROVENANCE]["dropped_before"] == [2, 0, 0]
