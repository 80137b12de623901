"""WeightTimeline: quanta of constant weights over the run, interpolated stretches, and cut sources."""

from __future__ import annotations

import pytest

from lightning_tune_data.mixing.timeline import SEGMENT_QUANTA, WeightTimeline


def test_a_linear_stretch_is_cut_into_quanta_with_the_weights_at_their_middles() -> None:
    timeline = WeightTimeline.from_points(["a", "b"], [(0.0, [0.9, 0.1]), (1000.0, [0.1, 0.9])], "linear",
                                          "documents", 8.0)
    assert len(timeline) == SEGMENT_QUANTA + 1  # the stretch, then the last point's weights
    assert timeline.weights_at(0.0)["a"] == pytest.approx(0.9 - 0.8 * 0.5 / SEGMENT_QUANTA)
    assert timeline.weights_at(500.0)["a"] == pytest.approx(0.5, abs=0.8 / SEGMENT_QUANTA)
    assert timeline.weights_at(5000.0) == {"a": 0.1, "b": 0.9}
    short = WeightTimeline.from_points(["a", "b"], [(0.0, [1.0, 0.0]), (10.0, [0.0, 1.0])], "linear", "documents", 1.0)
    assert len(short) == 11  # one quantum per step when the stretch is shorter than SEGMENT_QUANTA steps


def test_a_step_schedule_changes_only_at_its_points_and_holds_the_first_weights_before_the_first() -> None:
    timeline = WeightTimeline.from_points(["a", "b"], [(5.0, [1.0, 0.0]), (8.0, [0.0, 1.0])], "step", "tokens", 1.0)
    assert timeline.boundaries == [0.0, 8.0]
    assert timeline.weights_at(7.99) == {"a": 1.0, "b": 0.0} and timeline.weights_at(8.0) == {"a": 0.0, "b": 1.0}
    assert timeline.end_of(0) == 8.0 and timeline.end_of(1) == float("inf")


def test_a_cut_source_has_weight_zero_from_its_cut_on_and_the_others_share_the_mix() -> None:
    timeline = WeightTimeline.from_points(["a", "b", "c"], [(0.0, [0.5, 0.25, 0.25])], "step", "documents", 1.0,
                                          cuts={"b": 40.0, "c": 60.0})
    assert timeline.weights_at(39.0) == {"a": 0.5, "b": 0.25, "c": 0.25}
    assert timeline.weights_at(40.0) == pytest.approx({"a": 2 / 3, "b": 0.0, "c": 1 / 3})
    assert timeline.weights_at(61.0) == {"a": 1.0, "b": 0.0, "c": 0.0}
    everything = timeline.with_cuts({"a": 70.0})
    assert everything.weights_at(70.0) == {"a": 0.0, "b": 0.0, "c": 0.0}


def test_the_fingerprint_changes_with_any_weight_or_the_clock() -> None:
    def make(weight: float, per_position: float = 1.0) -> WeightTimeline:
        return WeightTimeline.from_points(["a", "b"], [(0.0, [weight, 1 - weight])], "step", "documents", per_position)

    assert make(0.5).fingerprint == make(0.5).fingerprint
    assert make(0.5).fingerprint != make(0.6).fingerprint != make(0.6, 2.0).fingerprint


def test_bad_tables_are_refused() -> None:
    with pytest.raises(ValueError, match="the first boundary at 0"):
        WeightTimeline(["a"], [1.0], [[1.0]], "documents", 1.0)
    with pytest.raises(ValueError, match="counts_per_position must be > 0"):
        WeightTimeline(["a"], [0.0], [[1.0]], "documents", 0.0)
