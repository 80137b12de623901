"""A packer's saved state: its entries, and snapshots that build it later for their moment."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from lightning_tune_data.packing.pack import Pack
from lightning_tune_data.packing.packer import IterablePackedDataset
from lightning_tune_data.packing.packer_state import (
    CHILD,
    CHILD_EXHAUSTED,
    COUNTERS,
    FINISHED,
    HELD,
    MAX_SEQ_LEN,
    NUM_OPEN,
    PACKS,
    PENDING,
    PackerSnapshots,
)
from lightning_tune_data.packing.piece_state import pending_state
from lightning_tune_data.packing.pieces import reference
from lightning_tune_data.packing.progress import PackingProgress
from lightning_tune_data.packing.strategies import STRATEGY
from lightning_tune_data.sources.arrow import ArrowSource
from lightning_tune_data.sources.memory import InMemoryStream
from packing_helpers import STRATEGIES, make_interleaved, random_docs, token_table

HEADER = [STRATEGY, MAX_SEQ_LEN, COUNTERS, NUM_OPEN, CHILD_EXHAUSTED, FINISHED]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_state_holds_the_settings_counters_packs_and_child_position(strategy):
    by_documents = IterablePackedDataset(make_interleaved(), 48, strategy=strategy, buffer_size=4)
    list(itertools.islice(by_documents, 5))
    own = by_documents.state_dict()["packed_interleaved"]
    assert list(own) == HEADER + [CHILD, PACKS]  # the child's state taken when the snapshot was
    assert own[STRATEGY] == strategy and own[MAX_SEQ_LEN] == 48 and own[COUNTERS]["packs"] == 5
    by_blocks = IterablePackedDataset(ArrowSource(token_table(200, seed=1), "s", seed=1), 48, strategy=strategy)
    list(itertools.islice(by_blocks, 5))
    assert list(by_blocks.state_dict()["packed_s"]) == HEADER + [PACKS, CHILD]  # the position after the placed ones
    assert list(by_blocks.snapshot()()["packed_s"]) == HEADER + [PACKS, CHILD]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_snapshot_built_later_describes_its_own_moment(strategy):
    packer = IterablePackedDataset(make_interleaved(), 48, strategy=strategy, buffer_size=4)
    stream = iter(packer)
    moments = []
    for _ in range(30):
        next(stream)
        moments.append((packer.snapshot(), json.loads(json.dumps(packer.state_dict()))))
    list(itertools.islice(stream, 50))  # the held packs grow and are handed out after the snapshots
    for snapshot, expected in moments:
        assert json.loads(json.dumps(snapshot())) == expected


def test_documents_restored_and_not_placed_yet_are_saved_as_pending_documents():
    source = ArrowSource(token_table(30, seed=2), "s", seed=1)
    progress = PackingProgress("greedy", 64, 4, "truncate")
    waiting = Pack()
    for row in (3, 4, 5):
        waiting.add(reference("s", row, 0, 2), np.arange(2))
    progress.restore([], [], [waiting], False, False)
    progress.queue.at = 1  # one of them placed since
    own = PackerSnapshots(source, "packed_s", 64).held(progress)()["packed_s"]
    assert list(own) == HEADER + [CHILD, PACKS, PENDING]
    assert own[CHILD] == source.state_dict()
    assert own[PENDING] == pending_state(waiting.refs, waiting.tokens, [None] * 3, 1)
    assert own[PENDING]["row"] == [4, 5]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_pending_documents_are_packed_first_after_a_restore_and_counted_when_merged(strategy):
    table = token_table(100, seed=3, max_len=20)
    lengths = [len(ids) for ids in table.column("input_ids").to_pylist()]

    def make() -> IterablePackedDataset:
        return IterablePackedDataset(ArrowSource(table, "s", seed=4), 64, strategy=strategy)

    saved = make().state_dict()
    waiting = Pack()
    for row in (7, 8):
        waiting.add(reference("s", row, 0, lengths[row]), np.arange(lengths[row]))
    saved["packed_s"][PENDING] = pending_state(waiting.refs, waiting.tokens, None, 0)
    resumed = make()
    resumed.load_state_dict(saved)
    assert resumed.state_dict()["packed_s"][PENDING]["row"] == [7, 8]
    first = next(iter(resumed)).pack
    after = resumed.state_dict()["packed_s"]
    assert PENDING not in after  # placed before the first block was read
    assert {7, 8} <= {ref[1] for ref in first.refs} | set(after[PACKS]["row"])
    if strategy != "best_fit":  # in the order they wait, ahead of every document read
        assert [ref[1] for ref in first.refs[:2]] == [7, 8]
    merged = resumed.merge_shard_states([saved])["packed_s"]
    assert set(merged) == {HELD, COUNTERS, CHILD} and merged[COUNTERS]["documents"] == 2
    assert merged[HELD]["row"] == [7, 8]


def test_merged_counters_are_the_sum_of_the_shards():
    packers = [IterablePackedDataset(InMemoryStream(random_docs(60, 8), "f", seed=4, rank=rank, world_size=2), 48,
                                     strategy="greedy") for rank in range(2)]
    for count, packer in zip((3, 5), packers):
        list(itertools.islice(packer, count))
    merged = packers[0].merge_shard_states([packer.state_dict() for packer in packers])["packed_f"]
    assert merged[COUNTERS]["packs"] == 8
    assert merged[COUNTERS]["documents"] == sum(packer.counters["documents"] for packer in packers)
