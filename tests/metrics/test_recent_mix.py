"""RecentMix: the mix of the last batches, alone and through the aggregator fed by real streams and collators."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from lightning_tune_data import InMemoryStream, InterleavedDataset, PaddedCollator
from lightning_tune_data.metrics.aggregator import DatasetMetricsAggregator
from lightning_tune_data.metrics.recent_mix import BATCHES, WINDOW, RecentMix

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


def test_aggregator_state_keeps_window_and_truncation_counts() -> None:
    aggregator = DatasetMetricsAggregator({"a": 0.6, "b": 0.4}, window=7)
    feed(aggregator, [0.6, 0.4], batches=10, seed=8)
    aggregator.update({"source": ["a"], "tokens": [4], "truncated_tokens": [9]})
    restored = DatasetMetricsAggregator({"a": 0.6, "b": 0.4}, window=7)
    restored.load_state_dict(aggregator.state_dict())
    assert restored.compute(distributed=False) == aggregator.compute(distributed=False)


def test_recent_mix_counts_documents_on_their_first_piece_and_tokens_on_every_piece() -> None:
    recent = RecentMix(window=3)
    recent.add_batch(["a", "b", "a"], [4, 7, 2], [True, True, False])
    assert recent.state_dict() == {WINDOW: 3, BATCHES: [{"a": [1, 6], "b": [1, 7]}]}
    assert RecentMix.shares([recent.state_dict()]) == {
        "a": {"window_share": 0.5, "window_token_share": 6 / 13},
        "b": {"window_share": 0.5, "window_token_share": 7 / 13},
    }
    assert RecentMix.shares([RecentMix(window=3).state_dict()]) == {}, "an empty window reports no source"


def test_loading_a_longer_saved_window_keeps_its_newest_batches() -> None:
    saved = RecentMix(window=4)
    for tokens in (1, 2, 3, 4):
        saved.add_batch(["a"], [tokens], [True])
    shorter = RecentMix(window=2)
    shorter.load_state_dict(saved.state_dict())
    assert shorter.state_dict() == {WINDOW: 2, BATCHES: [{"a": [1, 3]}, {"a": [1, 4]}]}
    shorter.load_state_dict({})
    assert shorter.state_dict() == {WINDOW: 2, BATCHES: []}


def test_folded_windows_add_up_batch_by_batch_aligned_at_the_newest_batch() -> None:
    first, second = RecentMix(window=3), RecentMix(window=2)
    for source, tokens in (("a", 1), ("a", 2), ("b", 3)):
        first.add_batch([source], [tokens], [True])
    second.add_batch(["a", "b"], [10, 20], [True, False])
    folded = RecentMix.folded([first.state_dict(), second.state_dict(), {}])
    # the second rank's only batch lines up with the first rank's newest one
    assert folded == {WINDOW: 3, BATCHES: [{"a": [1, 1]}, {"a": [1, 2]}, {"b": [1, 23], "a": [1, 10]}]}
    assert RecentMix.shares([folded]) == RecentMix.shares([first.state_dict(), second.state_dict()])
    assert RecentMix.folded([]) == {WINDOW: 0, BATCHES: []}

