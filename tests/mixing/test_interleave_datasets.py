"""interleave_datasets: weighted or round-robin interleaving of plain iterables, validated eagerly."""

from __future__ import annotations

import collections
import itertools

import pytest

from lightning_tune_data.keys import STOPPING_STRATEGIES
from lightning_tune_data.mixing.interleave_datasets import FINITE_STOPPING_STRATEGIES, interleave_datasets

WEIGHTS = {"a": 0.7, "b": 0.2, "c": 0.1}


def _assert_shares(sources: list[str], tol: float = 0.01) -> None:
    counts = collections.Counter(sources)
    for name, w in WEIGHTS.items():
        assert abs(counts[name] / len(sources) - w) <= tol, (name, counts, len(sources))


def _gen(name: str, count: int):
    return (f"{name}-{i}" for i in range(count))


def test_interleave_datasets_all_exhausted_yields_every_item_exactly_once():
    out = list(interleave_datasets([_gen("A", 5), _gen("B", 10), _gen("C", 3)], [0.6, 0.3, 0.1], seed=42,
                                   stopping_strategy="all_exhausted"))
    assert len(out) == 18
    assert sorted(out) == sorted([f"A-{i}" for i in range(5)] + [f"B-{i}" for i in range(10)]
                                 + [f"C-{i}" for i in range(3)])
    assert [x for x in out if x[0] == "B"] == [f"B-{i}" for i in range(10)]


def test_interleave_datasets_first_exhausted_stops_when_a_picked_source_is_empty():
    out = list(interleave_datasets([range(5), range(100, 110)], [1.0, 0.0], seed=0))
    assert out == [0, 1, 2, 3, 4]


def test_interleave_datasets_renormalises_and_shares_equally_when_only_zero_weights_remain():
    out = list(interleave_datasets([range(3), range(10, 14), range(20, 24)], [1.0, 0.0, 0.0], seed=1,
                                   stopping_strategy="all_exhausted"))
    assert out[:3] == [0, 1, 2]
    assert sorted(out[3:]) == [10, 11, 12, 13, 20, 21, 22, 23]


def test_interleave_datasets_is_reproducible_for_a_seed_and_works_on_any_iterable():
    def run(seed):
        return list(interleave_datasets([[1, 2, 3], "xyz", (9, 8)], [0.2, 0.5, 0.3], seed=seed,
                                        stopping_strategy="all_exhausted"))
    assert run(3) == run(3)
    assert sorted(map(str, run(3))) == sorted(["1", "2", "3", "x", "y", "z", "9", "8"])
    assert list(interleave_datasets([], [])) == []


def test_interleave_datasets_validates_eagerly():
    with pytest.raises(ValueError, match="must be the same"):
        interleave_datasets([range(2)], [0.5, 0.5])
    with pytest.raises(ValueError, match="must sum to 1.0"):
        interleave_datasets([range(2), range(2)], [0.5, 0.6])
    with pytest.raises(ValueError, match="stopping_strategy must be"):
        interleave_datasets([range(2)], [1.0], stopping_strategy="infinite")
    with pytest.raises(ValueError, match=">= 0"):
        interleave_datasets([range(2), range(2)], [1.5, -0.5])


def test_interleave_datasets_without_probabilities_alternates_like_the_datasets_library():
    assert list(interleave_datasets([[1, 2, 3], [10, 20]])) == [1, 10, 2, 20, 3]
    assert list(interleave_datasets([[1, 2, 3], [10]], stopping_strategy="all_exhausted")) == [1, 10, 2, 3]


def test_interleave_datasets_shares_follow_probabilities():
    big = [itertools.repeat(name) for name in WEIGHTS]
    sources = list(itertools.islice(interleave_datasets(big, list(WEIGHTS.values()), seed=0), 20_000))
    _assert_shares(sources)


def test_interleave_datasets_accepts_every_strategy_but_infinite_and_names_them_when_refusing():
    assert set(FINITE_STOPPING_STRATEGIES) == set(STOPPING_STRATEGIES) - {"infinite"}
    with pytest.raises(ValueError, match="must be 'first_exhausted' or 'all_exhausted', got 'infinite'"):
        interleave_datasets([range(2)], stopping_strategy="infinite")
    for strategy in FINITE_STOPPING_STRATEGIES:
        out = list(interleave_datasets([range(2), range(10, 12)], [0.5, 0.5], seed=0, stopping_strategy=strategy))
        assert out and set(out) <= {0, 1, 10, 11}
        if strategy == "all_exhausted":
            assert sorted(out) == [0, 1, 10, 11]


def test_interleave_datasets_all_exhausted_round_robin_continues_past_the_shorter_iterables():
    assert list(interleave_datasets([[1], [10, 20, 30], []], stopping_strategy="all_exhausted")) == [1, 10, 20, 30]
    assert list(interleave_datasets([[1], [10, 20, 30], []])) == [1, 10]  # first_exhausted: the empty one ends it


def test_interleave_datasets_first_exhausted_draws_nothing_past_the_first_picked_empty_iterable():
    out = list(interleave_datasets([range(100), range(1000, 1003)], [0.5, 0.5], seed=7))
    assert [x for x in out if x >= 1000] == [1000, 1001, 1002]  # the short one was read to its end ...
    assert len(out) < 103  # ... and its next pick stopped the stream before the long one ran out
