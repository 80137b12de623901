"""PackPlacer: the overlong policy, the finished packs, and which loop places a queue."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from lightning_tune_data.packing.document_queue import DocumentQueue
from lightning_tune_data.packing.pack import Pack
from lightning_tune_data.packing.pieces import PieceExtra, reference
from lightning_tune_data.packing.placement import PackPlacer
from packing_helpers import STRATEGIES


def _counters() -> dict[str, int]:
    return {"overlong_truncated": 0, "overlong_dropped": 0}


def _queue(lengths: list[int], extras: bool = False) -> DocumentQueue:
    refs = [reference("s", row, 0, n) for row, n in enumerate(lengths)]
    return DocumentQueue(refs, [np.arange(n) for n in lengths], [None] * len(lengths) if extras else None)


@pytest.mark.parametrize("strategy", ["greedy", "best_fit"])
def test_an_overlong_document_is_cut_with_the_cut_counted_in_its_reference_or_dropped(strategy):
    counters = _counters()
    placer = PackPlacer(strategy, 8, 4, "truncate", counters)
    extra = PieceExtra(np.arange(12), None)
    placer.place(reference("s", 0, 0, 12, truncated_tokens=3), np.arange(12), extra)
    (pack,) = placer.ready  # exactly full: finished at once
    assert pack.refs == [("s", 0, 0, 0, 8, True, 3 + 4, 0)] and pack.tokens[0].tolist() == list(range(8))
    assert pack.extras[0].labels[-1] == -100 and counters == {"overlong_truncated": 1, "overlong_dropped": 0}
    dropping = PackPlacer(strategy, 8, 4, "drop", counters)
    dropping.place(reference("s", 1, 0, 9), np.arange(9), None)
    assert not dropping.ready and not dropping.strategy.open and counters["overlong_dropped"] == 1


def test_a_strategy_that_splits_documents_gets_overlong_documents_whole():
    counters = _counters()
    placer = PackPlacer("concat", 8, 4, "drop", counters)
    placer.place(reference("s", 0, 0, 20), np.arange(20), None)
    assert [pack.length for pack in placer.ready] == [8, 8] and placer.strategy.open[2].length == 4
    assert counters == _counters() and placer.splits_documents


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_closing_finishes_every_open_pack_that_holds_tokens(strategy):
    placer = PackPlacer(strategy, 64, 4, "truncate", _counters())
    placer.place_from(_queue([5, 70, 9, 30, 41]), until_ready=100)
    open_lengths = [pack.length for pack in placer.strategy.open.values()]
    finished = len(placer.ready)
    placer.close_all()
    assert [pack.length for pack in list(placer.ready)[finished:]] == open_lengths and all(open_lengths)
    assert not placer.strategy.open


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_plain_queue_takes_the_strategys_block_loop_and_one_with_extras_the_general_path(strategy):
    placer = PackPlacer(strategy, 64, 4, "truncate", _counters())
    assert placer.placement_for(_queue([3])) == placer.strategy.place_block
    assert placer.placement_for(_queue([3], extras=True)) == placer.strategy.place_each


@pytest.mark.parametrize("strategy", ["greedy", "best_fit"])
@pytest.mark.parametrize("extras", [False, True])
def test_placing_from_a_queue_stops_right_after_the_document_that_finished_the_last_pack(strategy, extras):
    lengths = [int(n) for n in np.random.default_rng(2).integers(1, 40, size=200)]
    placer = PackPlacer(strategy, 48, 2, "truncate", _counters())
    queue = _queue(lengths, extras)
    placed = placer.place_from(queue, until_ready=3)
    assert len(placer.ready) == 3 and placed == queue.at
    one_less = PackPlacer(strategy, 48, 2, "truncate", _counters())
    for at in range(placed - 1):
        one_less.place(queue.refs[at], queue.tokens[at], None)
    assert len(one_less.ready) == 2  # the last placed document finished the third pack


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_held_packs_are_the_open_ones_then_the_finished_ones(strategy):
    placer = PackPlacer(strategy, 32, 3, "truncate", _counters())
    placer.place_from(_queue([int(n) for n in np.random.default_rng(4).integers(1, 30, size=40)]), until_ready=2)
    packs, counts, num_open = placer.held_packs()
    assert packs == list(placer.strategy.open.values()) + list(placer.ready)
    assert num_open == len(placer.strategy.open) and counts == [len(pack.refs) for pack in packs]


def test_a_placer_like_another_shares_its_settings_and_stores_but_no_packs():
    placer = PackPlacer("best_fit", 32, 3, "drop", _counters())
    placer.stores["s"] = object()
    placer.place_from(_queue([5, 9, 30, 12]), until_ready=100)
    counters = _counters()
    twin = placer.like(counters)
    assert (twin.strategy.name, twin.max_seq_len, twin.buffer_size, twin.overlong) == ("best_fit", 32, 3, "drop")
    assert twin.stores is placer.stores and twin.counters is counters
    assert not twin.strategy.open and not twin.ready


def test_new_open_packs_index_the_placers_stores():
    placer = PackPlacer("greedy", 32, 3, "truncate", _counters())
    restored = Pack()
    placer.set_open([restored])
    assert restored.stores is placer.stores
    placer.place(reference("s", 0, 0, 4), np.arange(4), None)
    assert next(iter(placer.strategy.open.values())).stores is placer.stores


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_pickled_placer_places_like_the_original(strategy):
    placer = PackPlacer(strategy, 32, 3, "truncate", _counters())
    lengths = [int(n) for n in np.random.default_rng(6).integers(1, 40, size=60)]
    placer.place_from(_queue(lengths[:30]), until_ready=100)
    copy = pickle.loads(pickle.dumps(placer))
    assert copy.strategy.placer is copy and copy.add == copy.strategy.add
    for each in (placer, copy):
        each.ready.clear()
        for n in lengths[30:]:
            each.place(reference("s", n, 0, n), np.arange(n), None)
    assert [pack.refs for pack in copy.ready] == [pack.refs for pack in placer.ready]
    assert copy.counters == placer.counters
