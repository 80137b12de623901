"""The packed hot path: block reading from an Arrow source and bulk collation of the packer's packs.

Both are faster routes to the same result: every test compares them with the one-document-at-a-time
stream and the per-sample collator, bit for bit, including exact resume after every pack.
"""

from __future__ import annotations

import json
import pickle

import numpy as np
import pyarrow as pa
import pytest
import torch

from lightning_tune_data.collate import PackedCollator
from lightning_tune_data.sources.arrow import ArrowSource
from lightning_tune_data.sources.arrow_columns import ListColumn
from lightning_tune_data.mixing.interleave import InterleavedDataset
from lightning_tune_data.sources.memory import InMemoryStream
from lightning_tune_data.packing import progress as packing_progress
from lightning_tune_data.packing.packer import IterablePackedDataset
from packing_helpers import DocumentsOnly, assert_taking_packs_equals_one_at_a_time, token_table

STRATEGIES = ("greedy", "best_fit", "concat")


def _take(stream, count: int) -> list[dict]:
    out, it = [], iter(stream)
    for _ in range(count):
        out.append(dict(next(it)))
    return out


def _assert_same(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert set(a) == set(b)
        for key in ("input_ids", "labels", "position_ids", "document_ids"):
            np.testing.assert_array_equal(a[key], b[key])
        assert a["seq_lens"] == b["seq_lens"] and a["provenance"] == b["provenance"]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("overlong", ["truncate", "drop"])
def test_block_reading_packs_exactly_what_document_reading_packs(strategy: str, overlong: str) -> None:
    table = token_table(300, seed=1, empty_every=17)
    limit = None if strategy == "concat" else 64
    fast = IterablePackedDataset(ArrowSource(table, "s", seed=4, max_seq_len=limit, overlong=overlong), 64,
                                 strategy=strategy, buffer_size=4)
    slow = IterablePackedDataset(DocumentsOnly(table, "s", seed=4, max_seq_len=limit, overlong=overlong), 64,
                                 strategy=strategy, buffer_size=4)
    assert fast._reads_blocks() and not slow._reads_blocks()
    _assert_same(_take(fast, 400), _take(slow, 400))  # several passes over the source
    assert fast.counters == slow.counters


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_block_reading_without_a_source_length_limit_applies_the_packer_overlong_policy(strategy: str) -> None:
    table = token_table(120, seed=2, max_len=150)
    fast = IterablePackedDataset(ArrowSource(table, "s", seed=1), 64, strategy=strategy)
    slow = IterablePackedDataset(DocumentsOnly(table, "s", seed=1), 64, strategy=strategy)
    _assert_same(_take(fast, 150), _take(slow, 150))
    assert fast.counters == slow.counters


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_state_after_every_pack_resumes_bitwise_with_documents_waiting_in_a_block(strategy: str) -> None:
    table = token_table(200, seed=3)
    reference = IterablePackedDataset(ArrowSource(table, "s", seed=2, max_seq_len=64), 64, strategy=strategy,
                                      buffer_size=4)
    it = iter(reference)
    states, packs = [], []
    for _ in range(60):
        packs.append(dict(next(it)))
        states.append(json.loads(json.dumps(reference.state_dict())))  # plain JSON, no token ids
    # Positions, not documents: no document of a block is saved, and the source's saved position
    # moves pack by pack although the whole table was read as one block.
    assert all("pending" not in state["packed_s"] for state in states)
    assert len({json.dumps(state["packed_s"]["child"]) for state in states}) > 30
    for stop in (0, 7, 31):
        resumed = IterablePackedDataset(ArrowSource(table, "s", seed=2, max_seq_len=64), 64, strategy=strategy,
                                        buffer_size=4)
        resumed.load_state_dict(states[stop])
        _assert_same(_take(resumed, 60 - stop - 1), packs[stop + 1 :])


def test_elastic_merge_hands_documents_held_from_a_block_to_the_new_shards_exactly_once() -> None:
    table = token_table(64, seed=5, max_len=40)
    stream = IterablePackedDataset(ArrowSource(table, "s", seed=0, max_seq_len=64, num_passes=1), 64,
                                   strategy="best_fit", buffer_size=2)
    it = iter(stream)
    seen = [tuple(p["input_ids"].tolist()) for p in (next(it) for _ in range(3))]
    merged = stream.merge_shard_states([stream.state_dict()])
    resumed = IterablePackedDataset(ArrowSource(table, "s", seed=0, max_seq_len=64, num_passes=1), 64,
                                    strategy="best_fit", buffer_size=2)
    resumed.load_global_state(merged)
    rest = [p for p in resumed]
    tokens = sorted([t for pack in seen for t in pack] + [t for p in rest for t in p["input_ids"].tolist()])
    everything = sorted(t for doc in table.column("input_ids").to_pylist() for t in doc)
    assert tokens == everything  # every document of the pass once: nothing lost, nothing repeated


def _packs_with_masks(strategy: str, count: int) -> list:
    rng = np.random.default_rng(7)
    docs = []
    for i in range(80):
        n = int(rng.integers(1, 30))
        doc = {"input_ids": rng.integers(0, 500, size=n).astype(np.int32)}
        if i % 3 == 0:
            doc["loss_mask"] = rng.random(n) < 0.6
        docs.append(doc)
    stream = IterablePackedDataset(InMemoryStream(docs, "m", seed=1), 32, strategy=strategy, buffer_size=3)
    it = iter(stream)
    return [next(it) for _ in range(count)]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("pad_to_multiple_of", [None, 8])
def test_bulk_collation_of_the_packers_packs_equals_the_per_sample_collation(strategy, pad_to_multiple_of) -> None:
    packs = _packs_with_masks(strategy, 24)
    collator = PackedCollator(pad_id=9, max_seq_len=32, pad_to_multiple_of=pad_to_multiple_of)
    for start in range(0, 24, 6):
        group = packs[start : start + 6]
        bulk = collator(group)
        plain = collator([dict(sample) for sample in group])  # plain dicts take the per-sample path
        assert set(bulk) == set(plain)
        for key, value in plain.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(bulk[key], value), key
        assert bulk["provenance"] == plain["provenance"]
        assert {"truncated_tokens", "dropped_before"} <= set(bulk["provenance"])


def test_bulk_collation_rejects_packs_longer_than_its_max_seq_len() -> None:
    packs = _packs_with_masks("concat", 2)
    with pytest.raises(ValueError, match="longer than max_seq_len=16"):
        PackedCollator(pad_id=0, max_seq_len=16)(packs)


def test_packed_provenance_carries_every_key_and_defaults_missing_ones_to_zero() -> None:
    from lightning_tune_data.collate import packed_provenance

    rows = [[{"source": "a", "epoch": 0, "tokens": 3, "new_document": True, "dropped_before": 2}],
            [{"source": "b", "epoch": 1, "tokens": 1, "new_document": False}]]
    assert packed_provenance(rows) == {
        "source": ["a", "b"], "epoch": [0, 1], "tokens": [3, 1], "row": [0, 1], "new_document": [True, False],
        "dropped_before": [2, 0], "truncated_tokens": [0, 0],
    }


def test_block_reading_of_an_all_empty_source_is_an_error_not_a_hang() -> None:
    empty = pa.table({"input_ids": pa.array([[]] * 6, type=pa.list_(pa.int32()))})
    source = ArrowSource(empty, "blank")
    with pytest.raises(RuntimeError, match="Source 'blank'.*no usable document"):
        source.read_block(4)


def test_read_block_yields_the_documents_iteration_yields_and_advances_the_same_state() -> None:
    table = token_table(50, seed=9, empty_every=7)
    blocks, documents = ArrowSource(table, "s", seed=3, max_seq_len=40), ArrowSource(table, "s", seed=3, max_seq_len=40)
    it = iter(documents)
    for _ in range(5):
        block = blocks.read_block(16)
        for ids, row, truncated in zip(block.input_ids, block.rows, block.truncated_tokens):
            document = next(it)
            assert document["source_row"] == row and document.get("truncated_tokens", 0) == truncated
            np.testing.assert_array_equal(document["input_ids"], ids)
            assert np.shares_memory(ids, blocks._rows.input_ids.rows(np.array([row]))[0])  # zero-copy views


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_snapshot_built_later_equals_the_state_dict_of_its_moment(strategy: str) -> None:
    table = token_table(300, seed=11)
    packer = IterablePackedDataset(ArrowSource(table, "s", seed=6, max_seq_len=64), 64, strategy=strategy,
                                   buffer_size=4)
    it = iter(packer)
    moments = []
    for _ in range(40):
        next(it)
        moments.append((packer.snapshot(), json.loads(json.dumps(packer.state_dict()))))
    for _ in range(200):  # packs keep growing and the block queue moves on after the snapshots
        next(it)
    for snapshot, expected in moments:
        assert json.loads(json.dumps(snapshot())) == expected


def _mixed_child(overlong: str) -> InterleavedDataset:
    children = [ArrowSource(token_table(700, seed=21), "web", seed=3, max_seq_len=64, overlong=overlong),
                ArrowSource(token_table(150, seed=22, empty_every=7), "code", seed=4, max_seq_len=64, overlong=overlong)]
    return InterleavedDataset(children, [0.7, 0.3], seed=5)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("overlong", ["truncate", "drop"])
@pytest.mark.parametrize("child", ["source", "mixture"])
def test_snapshot_replayed_from_the_block_start_equals_the_held_packs_of_its_moment(strategy, overlong, child,
                                                                                   monkeypatch) -> None:
    # Several blocks per pass and pass boundaries; documents up to 120 tokens against packs of 64.
    monkeypatch.setattr(packing_progress, "_BLOCK_DOCUMENTS", 256)
    source = (ArrowSource(token_table(1100, seed=20, max_len=120, empty_every=11), "s", seed=6, max_seq_len=None)
              if child == "source" else _mixed_child(overlong))
    packer = IterablePackedDataset(source, 64, strategy=strategy, buffer_size=5, overlong=overlong)
    it = iter(packer)
    moments, replayed = [], 0
    for step in range(900):
        next(it)
        if step % 7 and step % 61 != 60:
            continue
        progress = packer._progress
        replayed += progress.block_start is not None and progress.block_start.queue is progress.queue
        held = json.loads(json.dumps(packer._snapshots.held(progress)()))  # every held pack walked at this moment
        moments.append((packer.snapshot(), held))
    for _ in range(300):  # the held packs keep growing and later blocks are read before the builds
        next(it)
    assert replayed == len(moments) > 100
    for snapshot, expected in moments:
        assert json.loads(json.dumps(snapshot())) == expected


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_snapshots_fall_back_to_the_held_packs_after_a_restore_and_at_the_end_of_the_child(strategy: str) -> None:
    def packer() -> IterablePackedDataset:
        return IterablePackedDataset(ArrowSource(token_table(600, seed=23), "s", seed=1, max_seq_len=64, num_passes=1), 64,
                                     strategy=strategy, buffer_size=4)

    first = packer()
    it = iter(first)
    for _ in range(30):
        next(it)
    resumed = packer()
    resumed.load_state_dict(first.state_dict())
    assert resumed._progress.block_start is None  # restored: nothing to replay from until the next block
    assert resumed.snapshot()() == first.state_dict()
    rest_first, rest_resumed = list(it), []
    for pack in resumed:
        rest_resumed.append(dict(pack))
        assert resumed.snapshot()() == resumed._snapshots.held(resumed._progress)()
    _assert_same(rest_resumed, [dict(pack) for pack in rest_first])
    assert resumed.state_dict()["packed_s"]["finished"]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("count", [1, 4, 9])
def test_taking_packs_from_blocks_in_batches_hands_out_the_packs_and_state_of_one_at_a_time(strategy, count) -> None:
    def make() -> IterablePackedDataset:
        source = ArrowSource(token_table(700, seed=29, empty_every=13), "s", seed=3, max_seq_len=64, num_passes=1)
        return IterablePackedDataset(source, 64, strategy=strategy, buffer_size=4)

    assert make()._reads_blocks()
    assert_taking_packs_equals_one_at_a_time(make, count)


def test_train_loader_takes_snapshots_in_process_and_builds_the_state_only_when_asked() -> None:
    from lightning_tune_data.loading.loaders import LoaderOptions, build_train_loader

    table = token_table(300, seed=12)
    packer = IterablePackedDataset(ArrowSource(table, "s", seed=1, max_seq_len=64), 64, strategy="best_fit")
    loader = build_train_loader(packer, PackedCollator(pad_id=0, max_seq_len=64), LoaderOptions(batch_size=4), seed=0)
    it = iter(loader)
    for _ in range(5):
        next(it)
    assert all(callable(state["dataset"]) for _, state in loader._history)  # nothing built per batch
    state = loader.state_after(3)
    assert isinstance(state["dataset"], dict) and state["dataset"]["packed_s"]["counters"]["packs"] == 12


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_batches_from_token_positions_equal_batches_from_token_views(strategy: str, monkeypatch) -> None:
    table = token_table(400, seed=4, empty_every=13)

    def batches() -> list[dict]:
        packer = IterablePackedDataset(ArrowSource(table, "s", seed=2, max_seq_len=64), 64, strategy=strategy,
                                       buffer_size=4)
        collate, it = PackedCollator(pad_id=0, max_seq_len=64), iter(packer)
        return [collate([next(it) for _ in range(4)]) for _ in range(40)]

    by_position = batches()
    monkeypatch.setattr(ListColumn, "flat", lambda self: None)  # every document read as a view
    by_view = batches()
    for got, want in zip(by_position, by_view):
        for key in ("input_ids", "labels", "position_ids", "document_ids", "attention_mask", "seq_lens"):
            assert torch.equal(got[key], want[key])
        assert got["provenance"] == want["provenance"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_packer_pickled_mid_iteration_continues_with_the_same_packs(strategy: str) -> None:
    packer = IterablePackedDataset(ArrowSource(token_table(300, seed=8), "s", seed=1, max_seq_len=64), 64,
                                   strategy=strategy, buffer_size=4)
    it = iter(packer)
    for _ in range(57):
        next(it)
    copy = pickle.loads(pickle.dumps(packer))
    _assert_same(_take(copy, 60), [dict(next(it)) for _ in range(60)])
