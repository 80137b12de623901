"""OnlineTimeline: where each controller version starts is fixed in advance, its weights come from
the shared table, and a schedule's weights multiply them."""

from __future__ import annotations

import pickle

import pytest

from lightning_tune_data.mixing.online_timeline import OnlineTimeline
from lightning_tune_data.mixing.timeline import WeightTimeline
from lightning_tune_data.mixing.weight_versions import WeightVersions


def test_versions_start_at_their_update_step_plus_the_delay() -> None:
    versions = WeightVersions(["a", "b"], [0.75, 0.25], capacity=8)
    timeline = OnlineTimeline(["a", "b"], versions, every=10, delay=3, count="documents", counts_per_position=8.0)
    assert timeline.quantum_of(0) == 0 and timeline.quantum_of(12.9) == 0
    assert timeline.quantum_of(13) == 1 and timeline.end_of(1) == 23 and timeline.boundaries[2] == 23
    assert timeline.weights(0) == [0.75, 0.25]
    with pytest.raises(RuntimeError, match="has not computed yet"):  # never guesses the next version
        timeline.weights(1)
    versions.publish([0.2, 0.6])
    assert timeline.weights(1) == pytest.approx([0.25, 0.75])  # normalised
    assert timeline.weights_at(15) == pytest.approx({"a": 0.25, "b": 0.75})


def test_a_schedule_multiplies_the_controllers_weights() -> None:
    base = WeightTimeline(["a", "b"], [0.0, 4.0], [[0.5, 0.5], [0.9, 0.1]], "documents", 8.0)
    versions = WeightVersions(["a", "b"], [0.5, 0.5], capacity=8)
    versions.publish([0.25, 0.75])
    timeline = OnlineTimeline(["a", "b"], versions, every=4, delay=1, count="documents", counts_per_position=8.0,
                              base=base)
    starts = [timeline.boundaries[q] for q in range(4)]
    assert starts == [0.0, 4.0, 5.0, 9.0]  # the schedule's point at 4, versions 1 and 2 at 4 + 1 and 8 + 1
    assert [timeline.version_of(q) for q in range(4)] == [0, 0, 1, 2]
    assert timeline.weights(0) == pytest.approx([0.5, 0.5])
    assert timeline.weights(1) == pytest.approx([0.9, 0.1])
    mixed = [0.9 * 0.25, 0.1 * 0.75]
    assert timeline.weights(2) == pytest.approx([m / sum(mixed) for m in mixed])
    versions.publish([1.0, 0.0])
    cut = WeightTimeline(["a", "b"], [0.0], [[0.0, 1.0]], "documents", 8.0)
    only_b = OnlineTimeline(["a", "b"], versions, every=2, delay=1, count="documents", counts_per_position=8.0, base=cut)
    assert only_b.weights(only_b.quantum_of(6)) == [0.0, 1.0]  # a product of 0: the base's weights hold


def test_the_fingerprint_is_the_settings_not_the_weights() -> None:
    one = OnlineTimeline(["a", "b"], WeightVersions(["a", "b"], [0.5, 0.5], 4), 4, 2, "documents", 8.0)
    two = OnlineTimeline(["a", "b"], WeightVersions(["a", "b"], [0.1, 0.9], 4), 4, 2, "documents", 8.0)
    other = OnlineTimeline(["a", "b"], WeightVersions(["a", "b"], [0.5, 0.5], 4), 4, 3, "documents", 8.0)
    assert one.fingerprint == two.fingerprint != other.fingerprint
    one.weights(0)
    copy = pickle.loads(pickle.dumps(one))
    assert copy._weights == {} and copy.weights(0) == [0.5, 0.5]
