"""The draw rule of a mixture whose weights change over the stream: shares follow the timeline,
blocks draw what iteration draws, resume is exact, a new layout keeps the position and what is owed."""

from __future__ import annotations

import itertools
import logging

import numpy as np
import pyarrow as pa
import pytest
from mixtures import key, roundtrip, stream

from lightning_tune_data.mixing.interleave import InterleavedDataset
from lightning_tune_data.mixing.timeline import WeightTimeline
from lightning_tune_data.sources.arrow import ArrowSource


def linear(count: str = "documents", per_position: float = 1.0, span: float = 1000.0, description: str = "lin"):
    return WeightTimeline.from_points(["a", "b"], [(0.0, [0.9, 0.1]), (span, [0.1, 0.9])], "linear", count,
                                      per_position, description=description)


def mixture(timeline: WeightTimeline, mix_by: str = "documents", rank: int = 0, world_size: int = 1):
    children = [stream("a", 64, seed=0, rank=rank, world_size=world_size),
                stream("b", 64, seed=1, rank=rank, world_size=world_size)]
    return InterleavedDataset(children, [1, 1], seed=5, mix_by=mix_by, timeline=timeline, rank=rank,
                              world_size=world_size)


def test_the_share_of_each_window_follows_the_timeline() -> None:
    sources = [d["source"] for d in itertools.islice(iter(mixture(linear())), 1000)]
    for start in range(0, 1000, 100):
        target = sum(linear().weights_at(p + 0.5)["a"] for p in range(start, start + 100)) / 100
        assert sources[start:start + 100].count("a") / 100 == pytest.approx(target, abs=0.04)


def test_a_child_at_weight_zero_is_not_drawn() -> None:
    timeline = WeightTimeline.from_points(["a", "b"], [(0.0, [1.0, 0.0]), (50.0, [0.0, 1.0])], "step", "documents", 1.0)
    sources = [d["source"] for d in itertools.islice(iter(mixture(timeline)), 120)]
    assert set(sources[:50]) == {"a"} and set(sources[50:]) == {"b"}


@pytest.mark.parametrize("mix_by", ["documents", "tokens"])
@pytest.mark.parametrize("stop", [1, 137, 500])
def test_resume_from_any_draw_continues_exactly(mix_by: str, stop: int) -> None:
    timeline = linear("tokens", 1.0, span=1200.0) if mix_by == "tokens" else linear()
    full = [key(d) for d in itertools.islice(iter(mixture(timeline, mix_by)), stop + 300)]
    first = mixture(timeline, mix_by)
    it = iter(first)
    assert [key(d) for d in itertools.islice(it, stop)] == full[:stop]
    resumed = mixture(timeline, mix_by)
    resumed.load_state_dict(roundtrip(first.state_dict()))
    assert [key(d) for d in itertools.islice(iter(resumed), 300)] == full[stop:]


def _arrow_mixture(timeline: WeightTimeline, blocks: bool) -> InterleavedDataset:
    class DocumentsOnly(ArrowSource):
        def blocks_supported(self) -> bool:
            return False

    rng = np.random.default_rng(0)
    tables = {n: pa.table({"input_ids": pa.array([rng.integers(0, 99, size=int(k)).astype(np.int32)
                                                  for k in rng.integers(1, 40, size=200)], type=pa.list_(pa.int32()))})
              for n in "ab"}
    source = ArrowSource if blocks else DocumentsOnly
    return InterleavedDataset([source(t, n, seed=3) for n, t in tables.items()], [1, 1], seed=9, timeline=timeline)


def test_blocks_draw_what_iteration_draws_with_the_same_state_after_each_across_quanta() -> None:
    timeline = linear(span=600.0)
    by_block, by_document = _arrow_mixture(timeline, True), _arrow_mixture(timeline, False)
    documents = iter(by_document)
    for limit in (5, 300, 401):
        block = by_block.read_block(limit)
        for k in range(limit):
            assert block.refs[k][0] == next(documents)["source"]
            if k % 37 == 0 or k == limit - 1:
                assert by_block.state_after_block(block, k + 1) == by_document.state_dict()


def test_a_new_layout_keeps_the_position_and_what_each_child_is_owed() -> None:
    timeline = WeightTimeline.from_points(["a", "b"], [(0.0, [1.0, 0.0]), (300.0, [0.0, 1.0])], "step", "documents", 1.0)
    shards = [mixture(timeline, rank=r, world_size=2) for r in range(2)]
    for shard in shards:  # each shard draws 100: the whole run is at position 200
        list(itertools.islice(iter(shard), 100))
    merged = shards[0].merge_shard_states([roundtrip(s.state_dict()) for s in shards])
    alone = mixture(timeline)
    alone.load_global_state(roundtrip(merged))
    sources = [d["source"] for d in itertools.islice(iter(alone), 150)]
    assert set(sources[:100]) == {"a"} and set(sources[100:]) == {"b"}  # the switch at 300, not at 100


def test_resuming_with_another_schedule_warns_and_applies_it_from_the_resume_on(caplog) -> None:
    first = mixture(linear())
    list(itertools.islice(iter(first), 200))
    switched = WeightTimeline.from_points(["a", "b"], [(0.0, [0.0, 1.0])], "step", "documents", 1.0, description="b")
    resumed = mixture(switched)
    with caplog.at_level(logging.WARNING):
        resumed.load_state_dict(roundtrip(first.state_dict()))
    assert "another mixture schedule" in caplog.text
    assert {d["source"] for d in itertools.islice(iter(resumed), 50)} == {"b"}


def test_a_timeline_whose_sources_all_reached_their_caps_stops_with_a_clear_error() -> None:
    timeline = WeightTimeline.from_points(["a", "b"], [(0.0, [0.5, 0.5])], "step", "documents", 1.0,
                                          cuts={"a": 10.0, "b": 20.0})
    with pytest.raises(RuntimeError, match="every source has reached its cap"):
        list(itertools.islice(iter(mixture(timeline)), 100))


def test_a_timeline_must_name_the_children_in_order() -> None:
    timeline = WeightTimeline.from_points(["b", "a"], [(0.0, [0.5, 0.5])], "step", "documents", 1.0)
    with pytest.raises(ValueError, match="give the schedule the children's names"):
        mixture(timeline)
