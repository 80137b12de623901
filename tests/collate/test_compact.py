"""Compact batches: what a worker sends, and that expanding it gives the full batch bit for bit.

Every test compares ``expand_batch(collator(samples))`` of a ``compact=True`` collator with the
``compact=False`` collator's batch: same keys in the same order, same dtypes, shapes and values,
same provenance; over random padded batches (masks, truncation, padding multiples, mixed dtypes)
and the packer's own packs for every strategy, with and without masked documents.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from collate_samples import PAD, doc
from test_padded import random_document_samples

from lightning_tune_data.collate import PackedCollator, PaddedCollator, expand_batch
from lightning_tune_data.collate.compact import compact_ids_dtype, compact_tensors
from lightning_tune_data.collate.expand import _EXPANSIONS
from lightning_tune_data.keys import COMPACT_LAYOUT, INPUT_IDS, PROVENANCE, ROW_LENGTHS, SEQ_LENS, TARGET_MASK
from lightning_tune_data.packing.packer import IterablePackedDataset
from lightning_tune_data.sources.memory import InMemoryStream

STRATEGIES = ("greedy", "best_fit", "concat")


def expanded(batch: dict[str, Any]) -> dict[str, Any]:
    """``expand_batch`` (NumPy on the host), checked equal to the torch expansion a device runs."""
    full = expand_batch(batch)
    if COMPACT_LAYOUT in batch:
        assert_same_batch(_EXPANSIONS[batch[COMPACT_LAYOUT]][0](batch), full)
    return full


def assert_same_batch(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert list(got) == list(want)
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
            assert torch.equal(got[key], value), key
        else:
            assert got[key] == value, key


def packer_packs(strategy: str, masked: bool, count: int, seed: int = 7) -> list:
    rng = np.random.default_rng(seed)
    documents = []
    for i in range(160):
        n = int(rng.integers(1, 30))
        document = {"input_ids": rng.integers(0, 500, size=n).astype(np.int32)}
        if masked and i % 3 == 0:
            document["loss_mask"] = rng.random(n) < 0.6
        documents.append(document)
    stream = iter(IterablePackedDataset(InMemoryStream(documents, "m", seed=1), 32, strategy=strategy, buffer_size=3))
    return [next(stream) for _ in range(count)]


@pytest.mark.parametrize("masks", [False, True], ids=["no-mask", "loss-mask"])
@pytest.mark.parametrize(("max_seq_len", "pad_to_multiple_of"), [(None, None), (None, 8), (1, None), (17, 4), (40, 64)])
def test_expanded_compact_padded_batches_equal_full_batches_bit_for_bit(masks, max_seq_len, pad_to_multiple_of) -> None:
    rng = np.random.default_rng([int(masks), max_seq_len or 0, pad_to_multiple_of or 0])
    full = PaddedCollator(PAD, max_seq_len, pad_to_multiple_of)
    compact = PaddedCollator(PAD, max_seq_len, pad_to_multiple_of, compact=True)
    for _ in range(30):
        samples = random_document_samples(rng, masks, counts=True)
        batch = compact(samples)
        assert batch[COMPACT_LAYOUT] == "padded" and batch[INPUT_IDS].dtype == torch.int32
        has_mask = any(sample.get("loss_mask") is not None for sample in samples)
        assert (TARGET_MASK in batch) == has_mask  # the mask travels only when a document has one
        assert_same_batch(expanded(batch), full(samples))


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("masked", [False, True], ids=["plain", "masked"])
@pytest.mark.parametrize("pad_to_multiple_of", [None, 8])
def test_expanded_compact_packed_batches_equal_full_batches_bit_for_bit(strategy, masked, pad_to_multiple_of) -> None:
    packs = packer_packs(strategy, masked, 36)
    full = PackedCollator(pad_id=9, max_seq_len=32, pad_to_multiple_of=pad_to_multiple_of)
    compact = PackedCollator(pad_id=9, max_seq_len=32, pad_to_multiple_of=pad_to_multiple_of, compact=True)
    for start in range(0, 36, 6):
        group = packs[start: start + 6]
        batch = compact(group)
        assert batch[COMPACT_LAYOUT] == "packed" and batch[INPUT_IDS].dtype == torch.int32
        assert batch[SEQ_LENS].dtype == torch.int64
        assert (TARGET_MASK in batch) == masked
        assert_same_batch(expanded(batch), full(group))


def test_a_compact_packed_batch_is_the_fraction_of_a_full_one_it_claims() -> None:
    packs = packer_packs("best_fit", masked=False, count=8)
    full = PackedCollator(pad_id=9, max_seq_len=32)(packs)
    compact = PackedCollator(pad_id=9, max_seq_len=32, compact=True)(packs)
    full_bytes = sum(v.numel() * v.element_size() for v in full.values() if isinstance(v, torch.Tensor))
    compact_bytes = sum(v.numel() * v.element_size() for v in compact.values() if isinstance(v, torch.Tensor))
    tokens = full[INPUT_IDS].numel()
    assert full_bytes == 5 * 8 * tokens + full[SEQ_LENS].numel() * 8
    assert compact_bytes == 4 * tokens + compact[SEQ_LENS].numel() * 8


def test_hand_made_packed_samples_and_ids_equal_to_the_ignore_label_get_full_batches() -> None:
    packs = packer_packs("greedy", masked=False, count=4)
    collator = PackedCollator(pad_id=9, max_seq_len=32, compact=True)
    plain = collator([dict(sample) for sample in packs])  # per-sample path: its fields are taken as given
    assert COMPACT_LAYOUT not in plain and expand_batch(plain) is plain
    negative = PaddedCollator(PAD, compact=True)([doc([5, -100, 6]), doc([1])])
    assert COMPACT_LAYOUT not in negative  # labels of a -100 id are exact only in a full batch
    assert_same_batch(negative, PaddedCollator(PAD)([doc([5, -100, 6]), doc([1])]))


@pytest.mark.parametrize(
    ("values", "pad_id", "expected"),
    [
        (np.array([0, 5, 2**31 - 1], dtype=np.int64), 0, np.int32),
        (np.array([0, 2**31], dtype=np.int64), 0, np.int64),
        (np.array([7, 2**32 - 1], dtype=np.uint32), 0, np.int64),
        (np.array([7, 65_535], dtype=np.uint16), 2**31, np.int64),  # the pad id must fit too
        (np.array([-99, 4], dtype=np.int32), 0, np.int32),
        (np.array([-100, 4], dtype=np.int16), 0, None),
        (np.array([], dtype=np.uint64), 3, np.int32),
    ],
)
def test_token_ids_travel_as_int32_only_when_every_id_and_the_pad_id_fit(values, pad_id, expected) -> None:
    got = compact_ids_dtype(values, pad_id)
    assert got == (None if expected is None else np.dtype(expected))


def test_wide_token_ids_travel_as_int64_and_expand_to_the_same_batch() -> None:
    samples = [doc([1, 2, 3]), doc([4])]
    for sample, big in zip(samples, (2**40, 2**35)):
        sample["input_ids"] = sample["input_ids"].astype(np.int64) + big
    batch = PaddedCollator(PAD, compact=True)(samples)
    assert batch[INPUT_IDS].dtype == torch.int64 and batch[ROW_LENGTHS].tolist() == [3, 1]
    assert_same_batch(expanded(batch), PaddedCollator(PAD)(samples))


def as_is(batch: Any) -> Any:
    return batch


class PackedBatches(torch.utils.data.IterableDataset):
    def __iter__(self):
        collator = PackedCollator(pad_id=9, max_seq_len=32, compact=True)
        packs = packer_packs("concat", masked=True, count=4)
        yield collator(packs)


@pytest.mark.slow
def test_a_compact_batch_leaves_a_worker_as_arrays_pickled_inline_and_the_loader_wraps_them() -> None:
    # the collator's batch as is (as the train loader's collate_fn returns it; default_convert would wrap it)
    loader = torch.utils.data.DataLoader(PackedBatches(), batch_size=None, num_workers=1, collate_fn=as_is)
    (batch,) = list(loader)
    assert all(isinstance(batch[key], np.ndarray) for key in (INPUT_IDS, SEQ_LENS, TARGET_MASK))  # no shm segment
    batch = compact_tensors(batch)
    assert all(isinstance(batch[key], torch.Tensor) for key in (INPUT_IDS, SEQ_LENS, TARGET_MASK))
    packs = packer_packs("concat", masked=True, count=4)
    assert_same_batch(expanded(batch), PackedCollator(pad_id=9, max_seq_len=32)(packs))
    assert isinstance(batch[PROVENANCE]["source"], list)
    full = {INPUT_IDS: np.zeros(2)}
    assert compact_tensors(full) is full and isinstance(full[INPUT_IDS], np.ndarray)  # only compact batches
