"""SourceCollectors: building, feeding, reporting and restoring the collectors of every name on one rank."""

from __future__ import annotations

import warnings

import pytest

from lightning_tune_data.metrics.collector import StandardMetricCollector
from lightning_tune_data.metrics.source_collectors import SourceCollectors


class RecordingCollector:
    """A collector without ``update_many`` or ``merge_metrics``: records what it is given.

    Args:
        dataset_name: Name the metric is reported under.
    """

    def __init__(self, dataset_name: str) -> None:
        self.dataset_name = dataset_name
        self.records: list[dict] = []

    def update_metrics(self, sample: dict) -> None:
        self.records.append(dict(sample))

    def get_metrics(self) -> dict:
        return {self.dataset_name: {"metrics": {"records": len(self.records)}}}

    def increment_epoch(self) -> None:
        pass

    def state_dict(self) -> dict:
        return {"records": list(self.records)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.records = list(state_dict["records"])


def test_collectors_are_built_on_first_use_and_kept_in_order_of_appearance() -> None:
    built: list[str] = []

    def factory(name: str) -> StandardMetricCollector:
        built.append(name)
        return StandardMetricCollector(name)

    collectors = SourceCollectors(factory)
    first = collectors.collectors_for("b")
    assert collectors.collectors_for("b") is first and len(first) == 1
    collectors.collectors_for("a")
    assert collectors.names == ["b", "a"] and built == ["b", "a"]
    throwaway = collectors.build("c")
    assert isinstance(throwaway, list) and collectors.names == ["b", "a"], "build does not keep what it builds"


def test_feed_uses_update_many_or_else_one_record_per_piece() -> None:
    collectors = SourceCollectors(lambda name: [StandardMetricCollector(name), RecordingCollector(name)])
    collectors.feed("a", [4, 5], [0, 2], [True, False])
    standard, recording = collectors.collectors_for("a")
    assert (standard.samples_seen, standard.tokens_seen, standard.epochs_completed) == (1, 9, 2)
    assert recording.records == [
        {"source": "a", "tokens": 4, "epoch": 0, "new_document": True},
        {"source": "a", "tokens": 5, "epoch": 2, "new_document": False},
    ]
    assert collectors.local_metrics() == {"a": {"metrics": {
        "samples_seen": 1, "tokens_seen": 9, "epochs_completed": 2, "seq_len_window_size": 2, "seq_len_mean": 4.5,
        "seq_len_p50": 4.5, "seq_len_p95": pytest.approx(4.95), "records": 2}}}


def test_reduced_metrics_merge_every_ranks_states_and_warn_once_for_unmergeable_collectors() -> None:
    collectors = SourceCollectors(lambda name: [StandardMetricCollector(name), RecordingCollector(name)])
    collectors.feed("a", [3], [0], [True])
    other = SourceCollectors(lambda name: [StandardMetricCollector(name), RecordingCollector(name)])
    other.feed("a", [5], [1], [True])
    other.feed("b", [7], [0], [True])
    rank_states = [collectors.state_dict(), other.state_dict()]
    with pytest.warns(UserWarning) as caught:
        out = collectors.reduced_metrics(["a", "b"], rank_states)
    assert [str(w.message).split(";")[0] for w in caught] == [
        f"DatasetMetricsAggregator: collector RecordingCollector for '{name}' has no merge_metrics(states)"
        for name in ("a", "b")
    ]
    assert out["a"]["metrics"]["samples_seen"] == 2 and out["a"]["metrics"]["seq_len_p50"] == 4.0
    assert out["a"]["metrics"]["records"] == 1, "an unmergeable collector reports this rank's own metrics"
    assert out["b"]["metrics"]["tokens_seen"] == 7 and "records" not in out["b"]["metrics"]
    assert collectors.names == ["a"], "a name only another rank saw is not kept"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert collectors.reduced_metrics(["a", "b"], rank_states) == out


def test_state_round_trips_and_a_factory_building_other_collectors_is_named() -> None:
    collectors = SourceCollectors(lambda name: [StandardMetricCollector(name, 2), RecordingCollector(name)])
    collectors.feed("a", [1, 2, 3], [0, 0, 0], [True, True, True])
    restored = SourceCollectors(lambda name: [StandardMetricCollector(name, 2), RecordingCollector(name)])
    restored.collectors_for("stale")
    restored.load_state_dict(collectors.state_dict())
    assert restored.names == ["a"] and restored.state_dict() == collectors.state_dict()
    assert restored.local_metrics() == collectors.local_metrics()
    single = SourceCollectors(StandardMetricCollector)
    with pytest.raises(ValueError, match="saved metrics for 'a' have 2 collector states but collectors_factory builds 1"):
        single.load_state_dict(collectors.state_dict())
