"""Batches planned from a block's lengths equal the straightforward batches, batch by batch.

The planned path reads documents in blocks (positions in the cache's flat token arrays), places a
block's documents from their cumulative lengths (``place_block``), takes a batch's packs in one
call and collates them in bulk from the pieces. The straightforward path reads one document dict
at a time, places each with the strategy's ``add`` and collates the packs' own arrays sample by
sample. Every batch must be the same tensors and provenance, and the state after every batch the
same, over several passes, mixtures of two and three sources, resumes and an elastic resume.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
import torch

from lightning_tune_data.collate import PackedCollator
from lightning_tune_data.keys import IGNORE_INDEX
from lightning_tune_data.mixing.interleave import InterleavedDataset
from lightning_tune_data.packing import progress as packing_progress
from lightning_tune_data.packing.packer import IterablePackedDataset
from lightning_tune_data.sources.arrow import ArrowSource
from packing_helpers import DocumentsOnly, token_table

STRATEGIES = ("greedy", "best_fit", "concat")
SEQ, BATCH, BATCHES = 64, 4, 90
MIXES = {  # (rows, table seed, max tokens per document, empty every) and weights
    "one source": ([(300, 31, 90, 13)], [1.0]),
    "two sources": ([(400, 32, 70, 0), (120, 33, 150, 7)], [0.6, 0.4]),
    "three sources": ([(300, 34, 90, 0), (90, 35, 40, 5), (200, 36, 130, 0)], [0.5, 0.3, 0.2]),
}


def _child(mix: str, strategy: str, planned: bool, rank: int, world_size: int):
    reader = ArrowSource if planned else DocumentsOnly
    limit = None if strategy == "concat" else SEQ
    tables, weights = MIXES[mix]
    sources = [reader(token_table(rows, seed=seed, max_len=max_len, empty_every=empty), f"s{i}", seed=i + 7,
                      max_seq_len=limit, rank=rank, world_size=world_size)
               for i, (rows, seed, max_len, empty) in enumerate(tables)]
    if len(sources) == 1:
        return sources[0]
    return InterleavedDataset(sources, weights, seed=11, rank=rank, world_size=world_size)


def _packer(mix: str, strategy: str, planned: bool, rank: int = 0, world_size: int = 1) -> IterablePackedDataset:
    packer = IterablePackedDataset(_child(mix, strategy, planned, rank, world_size), SEQ, strategy=strategy,
                                   buffer_size=6, dataset_name="packed")
    assert packer._reads_blocks() is planned
    return packer


def _batches(packer: IterablePackedDataset, planned: bool, count: int) -> list[tuple[dict, dict]]:
    """``count`` batches and the state after each: planned, the packs taken in one call and collated
    in bulk; else one pack at a time, collated from the packs' own arrays (plain dicts)."""
    collator = PackedCollator(pad_id=3, max_seq_len=SEQ)
    it = iter(packer)
    out = []
    for _ in range(count):
        if planned:
            batch = collator(it.take(BATCH))
            state = packer.snapshot()()  # what the train loader records after every batch
        else:
            batch = collator([dict(next(it)) for _ in range(BATCH)])
            state = packer.state_dict()
        out.append((batch, json.loads(json.dumps(state))))
    return out


def _assert_same_batches(got: list[tuple[dict, dict]], want: list[tuple[dict, dict]]) -> None:
    assert len(got) == len(want)
    for number, ((batch, state), (expected, expected_state)) in enumerate(zip(got, want)):
        assert set(batch) == set(expected)
        for key, value in expected.items():
            if isinstance(value, torch.Tensor):
                assert batch[key].dtype == value.dtype and torch.equal(batch[key], value), (number, key)
        assert batch["provenance"] == expected["provenance"], number
        assert state == expected_state, number


@pytest.fixture(autouse=True)
def _small_blocks(monkeypatch) -> None:
    monkeypatch.setattr(packing_progress, "_BLOCK_DOCUMENTS", 128)  # many blocks and block boundaries per pass


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("mix", list(MIXES))
def test_planned_batches_equal_straightforward_batches_and_states_over_passes(strategy: str, mix: str) -> None:
    planned, plain = _packer(mix, strategy, True), _packer(mix, strategy, False)
    got, want = _batches(planned, True, BATCHES), _batches(plain, False, BATCHES)
    _assert_same_batches(got, want)
    assert planned.counters == plain.counters
    epochs = {epoch for batch, _ in got for epoch in batch["provenance"]["epoch"]}
    assert len(epochs) > 1  # the batches run over several passes of a source
    if strategy == "concat":
        assert not all(new for batch, _ in got[:10] for new in batch["provenance"]["new_document"])  # documents cut


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("mix", ["one source", "three sources"])
def test_planned_batches_resumed_from_any_batch_continue_as_the_straightforward_run(strategy: str, mix: str) -> None:
    want = _batches(_packer(mix, strategy, False), False, BATCHES)
    for stop in (0, 17, 58):
        resumed = _packer(mix, strategy, True)
        resumed.load_state_dict(want[stop][1])
        _assert_same_batches(_batches(resumed, True, BATCHES - stop - 1), want[stop + 1 :])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_planned_batches_after_an_elastic_resume_equal_the_straightforward_ones(strategy: str) -> None:
    # Two old shards' states, resumed on one: it first packs the pieces they held, then reads on.
    old_states = [_batches(_packer("two sources", strategy, True, rank, 2), True, 9)[-1][1] for rank in range(2)]
    held = _packer("two sources", strategy, True).merge_shard_states(old_states)["packed"]["held"]
    assert len(held["row"]) > 0  # pieces held in the old shards' packs travel by reference
    runs = []
    for planned in (True, False):
        packer = _packer("two sources", strategy, planned)
        packer.load_shard_states(old_states)
        runs.append(_batches(packer, planned, 40))
    _assert_same_batches(*runs)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_planned_batches_count_targets_like_the_labels_when_tokens_equal_the_ignore_index(strategy: str) -> None:
    # A token id equal to IGNORE_INDEX makes its label look ignored: the bulk path must count
    # targets from the labels then, not from the pieces' lengths.
    rng = np.random.default_rng(5)
    docs = [rng.choice(np.array([IGNORE_INDEX, 1, 2, 3], dtype=np.int32), size=n) for n in rng.integers(1, 50, 200)]
    table = pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int32()))})
    limit = None if strategy == "concat" else SEQ
    runs = []
    for planned in (True, False):
        reader = ArrowSource if planned else DocumentsOnly
        packer = IterablePackedDataset(reader(table, "s0", seed=3, max_seq_len=limit), SEQ, strategy=strategy,
                                       buffer_size=6, dataset_name="packed")
        runs.append(_batches(packer, planned, 20))
    _assert_same_batches(*runs)
    provenance = runs[0][0][0]["provenance"]
    assert any(targets < tokens - 1 for targets, tokens in zip(provenance["target_tokens"], provenance["tokens"]))
