"""Recent-window mix metrics and length-policy counters, from real streams through the collators."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from lightning_tune_data import InMemoryStream, InterleavedDataset, PaddedCollator
from lightning_tune_data.metrics.aggregator import DatasetMetricsAggregator
from lightning_tune_data.metrics.window import LengthPolicyCounts, RecentMix

PAD = 258


def documents(count: int, length: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=length) for _ in range(count)]


def feed(aggregator: DatasetMetricsAggregator, weights: list[float], batches: int, seed: int) -> None:
    """``batches`` padded batches of 16 documents from a weighted mix of sources ``a`` (short) and ``b`` (long)."""
    stream = InterleavedDataset(
        [InMemoryStream(documents(200, 5, 1), "a", seed=seed), InMemoryStream(documents(200, 20, 2), "b", seed=seed)],
        weights, seed=seed,
    )
    collate = PaddedCollator(pad_id=PAD)
    samples = iter(stream)
    for _ in range(batches):
        batch = collate(list(itertools.islice(samples, 16)))
        aggregator.update(batch["provenance"], batch)


def test_window_share_shows_a_weight_change_within_one_window() -> None:
    aggregator = DatasetMetricsAggregator({"a": 0.6, "b": 0.4}, window=50)
    feed(aggregator, [0.6, 0.4], batches=200, seed=3)
    before = aggregator.compute(distributed=False)["a"]["metrics"]
    assert before["window_share"] == pytest.approx(0.6, abs=0.05)

    aggregator.set_source_weights({"a": 0.2, "b": 0.8})  # as after a resume with new weights
    feed(aggregator, [0.2, 0.8], batches=50, seed=4)  # exactly one window later
    after = aggregator.compute(distributed=False)["a"]["metrics"]
    assert after["window_share"] == pytest.approx(0.2, abs=0.05), "the recent mix follows the new weight"
    assert after["share"] > 0.45, "the cumulative share is still dominated by the first 200 batches"
    # tokens: a's documents are 4x shorter, so its recent token share is about 0.2*5 / (0.2*5 + 0.8*20)
    assert after["window_token_share"] == pytest.approx(1 / 17, abs=0.02)
    assert after["target_weight"] == 0.2


def test_recent_mix_keeps_only_the_last_window_and_round_trips_its_state() -> None:
    recent = RecentMix(window=2)
    recent.add_batch(["a", "a"], [5, 5], [True, True])
    recent.add_batch(["b"], [30], [True])
    recent.add_batch(["a", "b"], [10, 10], [True, False])  # b's piece continues a document
    shares = RecentMix.shares([recent.state_dict()])
    assert shares["a"] == {"window_share": 0.5, "window_token_share": 10 / 50}
    assert shares["b"] == {"window_share": 0.5, "window_token_share": 40 / 50}
    restored = RecentMix(window=2)
    restored.load_state_dict(recent.state_dict())
    assert RecentMix.shares([restored.state_dict(), recent.state_dict()]) == shares, "two ranks' windows add up"
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        RecentMix(window=0)


def test_truncation_metrics_equal_the_overlong_documents() -> None:
    # Source "a": 3 of 8 documents were cut by the stream (truncated_tokens set), 2 dropped before others.
    a_docs = [{"input_ids": d} for d in documents(8, 6, 5)]
    for i, cut in ((0, 4), (3, 1), (6, 10)):
        a_docs[i]["truncated_tokens"] = cut
    a_docs[1]["dropped_before"] = 2
    # Source "b": 2 of 6 documents are longer than max_seq_len=8 and reach the collator's safety net.
    b_docs = documents(4, 6, 6) + documents(2, 11, 7)
    collate = PaddedCollator(pad_id=PAD, max_seq_len=8)
    aggregator = DatasetMetricsAggregator({"a": 1, "b": 1})
    for name, docs in (("a", a_docs), ("b", b_docs)):
        samples = list(itertools.islice(iter(InMemoryStream(docs, name, shuffle=False)), len(docs)))
        batch = collate(samples)
        aggregator.update(batch["provenance"], batch)
    metrics = aggregator.compute(distributed=False)
    assert {k: metrics["a"]["metrics"][k] for k in ("truncated_docs", "truncated_tokens", "dropped_docs")} == {
        "truncated_docs": 3, "truncated_tokens": 15, "dropped_docs": 2}
    assert {k: metrics["b"]["metrics"][k] for k in ("truncated_docs", "truncated_tokens", "dropped_docs")} == {
        "truncated_docs": 2, "truncated_tokens": 6, "dropped_docs": 0}
    assert metrics["all"]["metrics"]["truncated_docs"] == 5 and metrics["all"]["metrics"]["dropped_docs"] == 2


def test_length_policy_counts_each_document_once_and_sum_over_ranks() -> None:
    counts = LengthPolicyCounts()
    counts.add(["a", "a", "b"], [3, 3, 0], [0, 0, 1], [True, False, True])  # a's second piece continues the first
    other = LengthPolicyCounts()
    other.add(["a"], [2], [4], [True])
    merged = LengthPolicyCounts.merged([counts.state_dict(), other.state_dict()])
    assert merged == {"a": {"truncated_docs": 2, "truncated_tokens": 5, "dropped_docs": 4},
                      "b": {"truncated_docs": 0, "truncated_tokens": 0, "dropped_docs": 1}}


def test_aggregator_state_keeps_window_and_truncation_counts() -> None:
    aggregator = DatasetMetricsAggregator({"a": 0.6, "b": 0.4}, window=7)
    feed(aggregator, [0.6, 0.4], batches=10, seed=8)
    aggregator.update({"source": ["a"], "tokens": [4], "truncated_tokens": [9]})
    restored = DatasetMetricsAggregator({"a": 0.6, "b": 0.4}, window=7)
    restored.load_state_dict(aggregator.state_dict())
    assert restored.compute(distributed=False) == aggregator.compute(distributed=False)


def test_target_weights_are_reported_as_written() -> None:
    weights = DatasetMetricsAggregator({"prose": 0.6, "arithmetic": 0.3, "reverse": 0.1}).compute(distributed=False)
    assert [weights[n]["metrics"]["target_weight"] for n in ("prose", "arithmetic", "reverse")] == [0.6, 0.3, 0.1]
    assert repr(weights["reverse"]["metrics"]["target_weight"]) == "0.1"
