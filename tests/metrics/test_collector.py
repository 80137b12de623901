"""StandardMetricCollector: counters, bounded sequence-length window, merge across ranks, state."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch

from lightning_tune_data.metrics import MetricCollector, StandardMetricCollector
from lightning_tune_data.metrics.collector import MergeableMetricCollector


def record(tokens: int, epoch: int = 0, new_document: bool = True, source: str = "web") -> dict:
    """One provenance record.

    Args:
        tokens: Real tokens of the piece.
        epoch: Pass over the source.
        new_document: False for a continuation piece.
        source: Source name.
    """
    return {"source": source, "epoch": epoch, "tokens": tokens, "new_document": new_document}


def test_standard_collector_satisfies_the_collector_protocols() -> None:
    collector = StandardMetricCollector("web")
    assert isinstance(collector, MetricCollector)
    assert isinstance(collector, MergeableMetricCollector)


def test_window_keeps_only_the_most_recent_lengths() -> None:
    collector = StandardMetricCollector("web", seq_len_stat_window_size=5)
    for n in range(1, 101):
        collector.update_metrics(record(n))
    assert collector.seq_len_window == [96, 97, 98, 99, 100]
    assert len(collector.state_dict()["seq_lens"]) == 5
    metrics = collector.get_metrics()["web"]["metrics"]
    assert metrics["seq_len_window_size"] == 5
    assert metrics["samples_seen"] == 100 and metrics["tokens_seen"] == sum(range(1, 101))


def test_p50_is_the_median_of_the_window_and_p95_the_interpolated_quantile() -> None:
    lengths = [7, 3, 19, 4, 4, 11, 250, 8, 1, 30, 12]
    collector = StandardMetricCollector("code", seq_len_stat_window_size=8)
    for n in lengths:
        collector.update_metrics(record(n))
    window = lengths[-8:]
    metrics = collector.get_metrics()["code"]["metrics"]
    assert metrics["seq_len_p50"] == statistics.median(window)
    assert metrics["seq_len_mean"] == pytest.approx(statistics.fmean(window))
    assert metrics["seq_len_p95"] == pytest.approx(statistics.quantiles(window, n=20, method="inclusive")[18])


def test_continuation_pieces_add_tokens_but_not_samples() -> None:
    collector = StandardMetricCollector("books")
    collector.update_metrics(record(10))
    collector.update_metrics(record(6, new_document=False))
    metrics = collector.get_metrics()["books"]["metrics"]
    assert metrics["samples_seen"] == 1
    assert metrics["tokens_seen"] == 16


def test_epochs_completed_is_the_highest_epoch_index_seen() -> None:
    collector = StandardMetricCollector("books")
    for epoch in (0, 2, 1, 0):
        collector.update_metrics(record(5, epoch=epoch))
    assert collector.get_metrics()["books"]["metrics"]["epochs_completed"] == 2
    collector.increment_epoch()
    assert collector.get_metrics()["books"]["metrics"]["epochs_completed"] == 3


def test_update_many_matches_per_record_updates() -> None:
    tokens, epochs, flags = [3, 9, 4, 4, 12], [0, 1, 1, 3, 2], [True, False, True, True, False]
    one, many = StandardMetricCollector("a", 4), StandardMetricCollector("a", 4)
    for t, e, f in zip(tokens, epochs, flags):
        one.update_metrics(record(t, e, f))
    many.update_many(tokens, epochs, flags)
    assert one.state_dict() == many.state_dict()
    assert one.get_metrics() == many.get_metrics()


def test_empty_collector_reports_counters_without_distribution_statistics() -> None:
    metrics = StandardMetricCollector("web").get_metrics()
    assert metrics == {
        "web": {"metrics": {"samples_seen": 0, "tokens_seen": 0, "epochs_completed": 0, "seq_len_window_size": 0}}
    }


def test_merge_sums_counters_and_takes_statistics_of_the_union_of_windows() -> None:
    rank0, rank1 = StandardMetricCollector("web", 4), StandardMetricCollector("web", 4)
    for n in (1, 2, 3, 4, 5):
        rank0.update_metrics(record(n, epoch=1))
    for n in (100, 200, 300):
        rank1.update_metrics(record(n, epoch=4, new_document=n != 200))
    merged = rank0.merge_metrics([rank0.state_dict(), rank1.state_dict()])["web"]["metrics"]
    union = [2, 3, 4, 5, 100, 200, 300]
    assert merged["samples_seen"] == 5 + 2
    assert merged["tokens_seen"] == 15 + 600
    assert merged["epochs_completed"] == 4
    assert merged["seq_len_window_size"] == 7
    assert merged["seq_len_p50"] == statistics.median(union) == 5
    assert merged["seq_len_mean"] == pytest.approx(statistics.fmean(union))


def test_state_loads_with_weights_only_and_counting_continues(tmp_path: Path) -> None:
    collector = StandardMetricCollector("web", seq_len_stat_window_size=3)
    for n in (5, 6, 7, 8):
        collector.update_metrics(record(n, epoch=1))
    torch.save(collector.state_dict(), tmp_path / "state.pt")
    restored = StandardMetricCollector("web", seq_len_stat_window_size=3)
    restored.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert restored.get_metrics() == collector.get_metrics()
    restored.update_metrics(record(100))
    assert restored.get_metrics()["web"]["metrics"]["samples_seen"] == 5
    assert restored.seq_len_window == [7, 8, 100]


def test_loading_a_longer_window_keeps_its_newest_lengths() -> None:
    big = StandardMetricCollector("web", seq_len_stat_window_size=10)
    for n in range(10):
        big.update_metrics(record(n))
    small = StandardMetricCollector("web", seq_len_stat_window_size=3)
    small.load_state_dict(big.state_dict())
    assert small.seq_len_window == [7, 8, 9]


def test_invalid_arguments_and_foreign_state_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="seq_len_stat_window_size"):
        StandardMetricCollector("web", seq_len_stat_window_size=0)
    with pytest.raises(ValueError, match="dataset_name"):
        StandardMetricCollector("")
    with pytest.raises(KeyError, match="missing"):
        StandardMetricCollector("web").load_state_dict({"samples_seen": 1})
