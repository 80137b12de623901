"""ODM's EXP3 controller: the paper's exploration rate, policy and smoothed importance-weighted reward."""

from __future__ import annotations

import math

import pytest

from lightning_tune_data import MixController, OnlineDataMixing
from lightning_tune_data.mixing.online_mixing import exploration_rate, odm_policy


def test_exploration_rate_is_min_of_one_over_k_and_the_decay() -> None:
    assert exploration_rate(0, 4) == 0.25
    assert exploration_rate(1, 4) == 0.25  # sqrt(ln 4 / 4) = 0.59 > 1/4
    assert exploration_rate(100, 4) == pytest.approx(math.sqrt(math.log(4) / 400))


def test_policy_mixes_the_softmax_with_the_exploration_floor() -> None:
    policy = odm_policy([10.0, 0.0], eps_previous=0.1, eps=0.2)
    soft = math.exp(1.0) / (math.exp(1.0) + 1.0)
    assert policy == pytest.approx([0.6 * soft + 0.2, 0.6 * (1 - soft) + 0.2])
    assert sum(policy) == pytest.approx(1.0)


def test_updates_by_hand() -> None:
    odm = OnlineDataMixing(alpha=0.5)
    odm.start({"x": 3.0, "y": 1.0})
    first = odm.update(10, {"x": {"loss": 2.0, "tokens": 5, "documents": 1}, "y": {"tokens": 0, "documents": 0}})
    assert odm.rewards == pytest.approx([0.5 * 2.0 / 0.75, 0.0])  # y had no token: its reward stays
    assert first == {"x": 0.5, "y": 0.5}  # t = 1 with K = 2: eps = 1/2, the policy is uniform
    eps2 = math.sqrt(math.log(2) / 4)
    second = odm.update(20, {"x": {"loss": 1.0, "tokens": 5}, "y": {"loss": 4.0, "tokens": 5}})
    rewards = [0.5 * (0.5 * 2.0 / 0.75) + 0.5 * 1.0 / 0.5, 0.5 * 4.0 / 0.5]
    assert odm.rewards == pytest.approx(rewards)
    exps = [math.exp(0.5 * r) for r in rewards]
    assert list(second.values()) == pytest.approx([(1 - 2 * eps2) * e / sum(exps) + eps2 for e in exps])


def test_state_round_trip_continues_identically_and_warmup_keeps_the_start() -> None:
    stats = {"x": {"loss": 3.0, "tokens": 1}, "y": {"loss": 1.0, "tokens": 1}}
    one = OnlineDataMixing()
    one.start({"x": 0.5, "y": 0.5})
    for step in (1, 2, 3):
        one.update(step, stats)
    two = OnlineDataMixing()
    two.load_state_dict(one.state_dict())
    two.start({"x": 0.9, "y": 0.1})  # ignored: the checkpoint's state holds
    assert two.update(4, stats) == one.update(4, stats)
    warm = OnlineDataMixing(warmup_updates=2)
    warm.start({"x": 0.8, "y": 0.2})
    assert warm.update(1, stats) == warm.update(2, stats) == {"x": 0.8, "y": 0.2}
    assert warm.update(3, stats) != {"x": 0.8, "y": 0.2}
    assert isinstance(one, MixController)
    with pytest.raises(ValueError, match="alpha"):
        OnlineDataMixing(alpha=1.0)
