"""PackingProgress: a packer's position (packs, the block being placed, counters, end of child and round)."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_tune_data.packing import progress as progress_module
from lightning_tune_data.packing.pack import Pack
from lightning_tune_data.packing.pieces import reference
from lightning_tune_data.packing.progress import COUNTER_NAMES, PackingProgress
from lightning_tune_data.sources.arrow import ArrowSource
from packing_helpers import token_table


def test_a_new_position_holds_nothing_and_counts_zero():
    progress = PackingProgress("best_fit", 64, 4, "truncate")
    assert progress.counters == dict.fromkeys(COUNTER_NAMES, 0)
    assert progress.placer.counters is progress.counters  # the placer counts into the same dict
    assert not progress.queue and progress.block_start is None
    assert not progress.child_exhausted and not progress.finished


def test_reading_a_block_queues_its_documents_and_records_the_packs_held_then(monkeypatch):
    monkeypatch.setattr(progress_module, "_BLOCK_DOCUMENTS", 16)
    source = ArrowSource(token_table(40, seed=1), "s", seed=2, num_passes=1)
    progress = PackingProgress("best_fit", 64, 4, "truncate")
    assert progress.read_block(source)
    first = progress.queue
    assert len(first) == 16 and first.block is not None and progress.placer.stores == {"s": source}
    assert progress.block_start.queue is first and progress.block_start.packs == []
    progress.placer.place_from(first, until_ready=100)
    progress.counters["packs"] = 1  # as if the stream handed one pack out
    assert progress.read_block(source)
    start = progress.block_start
    assert start.queue is progress.queue is not first and start.packs_out == 1
    assert (start.packs, start.counts, start.num_open) == progress.placer.held_packs()
    while len(progress.queue) and progress.read_block(source):
        pass
    assert progress.read_block(source) is False  # the pass is over


def test_the_end_of_the_child_finishes_the_open_packs():
    progress = PackingProgress("greedy", 64, 4, "truncate")
    progress.placer.place(reference("s", 0, 0, 5), np.arange(5), None)
    progress.end_child()
    assert progress.child_exhausted and [pack.length for pack in progress.placer.ready] == [5]


def test_counters_are_replaced_in_place():
    progress = PackingProgress("greedy", 64, 4, "truncate")
    counters = progress.counters
    progress.set_counters({name: str(i) for i, name in enumerate(COUNTER_NAMES)})
    assert progress.counters is counters and progress.placer.counters is counters
    assert list(counters.values()) == list(range(len(COUNTER_NAMES)))


@pytest.mark.parametrize("strategy", ["greedy", "best_fit", "concat"])
def test_restoring_sets_the_packs_pending_documents_and_flags(strategy):
    progress = PackingProgress(strategy, 64, 4, "truncate")
    opened, finished, pending = Pack(), Pack(), Pack()
    opened.add(reference("s", 0, 0, 5), np.arange(5))
    finished.add(reference("s", 1, 0, 64), np.arange(64))
    pending.add(reference("s", 2, 0, 3), np.arange(3))
    pending.add(reference("s", 3, 0, 4), np.arange(4))
    progress.restore([opened], [finished], [pending], True, False)
    assert list(progress.placer.strategy.open.values()) == [opened] and list(progress.placer.ready) == [finished]
    assert progress.queue.refs == pending.refs and progress.queue.extras == [None, None]
    assert progress.queue.block is None and progress.block_start is None
    assert progress.child_exhausted and not progress.finished
    progress.drop_packs()
    assert not progress.placer.strategy.open and not progress.placer.ready and not progress.queue
    assert progress.queue.extras is None and progress.child_exhausted  # the flags stay
