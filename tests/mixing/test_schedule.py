"""DrawSchedule: the weighted draw rule, its jitter, the accounts, and the accounts across resumes."""

from __future__ import annotations

import collections
import itertools
import logging

import numpy as np
import pytest

from lightning_tune_data.mixing.interleave import InterleavedDataset
from lightning_tune_data.mixing.schedule import BLOCK_SIZE, DrawSchedule, check_weights
from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.memory import InMemoryStream
from mixtures import WEIGHTS
from mixtures import key as _key
from mixtures import mixture as _mixture
from mixtures import roundtrip as _roundtrip
from mixtures import stream as _stream

SCHEDULE_LOGGER = "lightning_tune_data.mixing.schedule"


def _schedule(weights: list[float], mix_by: str = "documents", seed: int = 0, rank: int = 0,
              world_size: int = 1) -> DrawSchedule:
    names = ["a", "b", "c"][: len(weights)]
    return DrawSchedule("mix", names, weights, mix_by, StreamSettings(seed=seed, rank=rank, world_size=world_size))


def _draws(schedule: DrawSchedule, count: int, tokens: dict[int, int] | None = None) -> list[int]:
    """``count`` draws of ``schedule``, each counted with its child's document length from ``tokens``."""
    candidates, uniforms, chosen = schedule.candidates(list(range(len(schedule.names)))), [-1, None], []
    schedule.start_counting()
    for _ in range(count):
        index = schedule.draw(candidates, uniforms)
        schedule.count(index, (tokens or {}).get(index, 1))
        chosen.append(index)
    return chosen


# ---------------------------------------------------------------- weights


def test_weights_are_normalised_with_a_warning_and_exposed_by_name(caplog):
    with caplog.at_level(logging.WARNING, logger=SCHEDULE_LOGGER):
        ds = InterleavedDataset([_stream("a", 4), _stream("b", 4)], [3, 1], seed=0)
    assert ds.weights == {"a": 0.75, "b": 0.25}
    assert "normalised weights" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=SCHEDULE_LOGGER):
        InterleavedDataset([_stream("a", 4), _stream("b", 4)], [0.5, 0.5], seed=0)
    assert caplog.text == ""


def test_zero_weight_child_is_never_drawn_in_an_infinite_mixture():
    ds = InterleavedDataset([_stream("a", 4), _stream("b", 4)], [1.0, 0.0], seed=0)
    assert {s["source"] for s in itertools.islice(ds, 500)} == {"a"}


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf"), "0.5", None])
def test_invalid_weight_is_rejected_naming_the_child(bad):
    with pytest.raises(ValueError, match=rf"weight .* of child 'b' is invalid"):
        InterleavedDataset([_stream("a", 4), _stream("b", 4)], [1.0, bad], seed=0)


def test_loading_a_state_with_other_weights_warns(caplog):
    saved = InterleavedDataset([_stream("a", 4), _stream("b", 4)], [0.5, 0.5], seed=0).state_dict()
    ds = InterleavedDataset([_stream("a", 4), _stream("b", 4)], [0.9, 0.1], seed=0)
    with caplog.at_level(logging.WARNING, logger=SCHEDULE_LOGGER):
        ds.load_state_dict(saved)
    assert "written with weights" in caplog.text


def test_check_weights_accepts_zeros_next_to_a_positive_weight_and_refuses_an_all_zero_mix():
    check_weights("mix", ["a", "b"], [0, 2.5])
    with pytest.raises(ValueError, match=r"weights \{'a': 0, 'b': 0.0\} sum to 0"):
        check_weights("mix", ["a", "b"], [0, 0.0])
    with pytest.raises(ValueError, match="weight True of child 'a' is invalid"):
        check_weights("mix", ["a"], [True])


def test_schedule_normalises_weights_and_draws_only_positive_ones_unless_none_is_left():
    schedule = _schedule([2.0, 0.0, 6.0])
    assert schedule.weights == [0.25, 0.0, 0.75]
    assert schedule.candidates([0, 1, 2]) == [(0, 4.0), (2, 1 / 0.75)]
    assert schedule.candidates([1]) == [(1, 1.0)]  # only a zero weight left: equal shares


# ---------------------------------------------------------------- the draw rule


def test_choose_takes_the_smallest_lag_when_the_jitter_is_the_same_for_all():
    schedule = _schedule([0.5, 0.25, 0.25])
    schedule.consumed = [[10.0, 0.0], [4.0, 0.0], [6.0, 0.0]]  # lags 20, 16, 24
    assert schedule.choose(schedule.candidates([0, 1, 2]), [0.5, 0.5, 0.5]) == 1
    assert schedule.choose(schedule.candidates([0, 2]), [0.5, 0.5, 0.5]) == 0


def test_draws_follow_the_weights_within_the_jitter_at_every_point():
    schedule = _schedule([0.5, 0.3, 0.2])
    chosen = _draws(schedule, 3000)
    for prefix in (100, 1000, 3000):
        counts = collections.Counter(chosen[:prefix])
        for index, weight in enumerate(schedule.weights):
            assert abs(counts[index] - weight * prefix) <= 32 + 1 / weight, (prefix, index, counts)
    assert schedule.draws == 3000
    assert [account[0] for account in schedule.consumed] == [chosen.count(i) for i in range(3)]


def test_token_schedule_counts_documents_and_tokens_and_balances_tokens():
    schedule = _schedule([0.5, 0.5], mix_by="tokens")
    chosen = _draws(schedule, 2000, tokens={0: 10, 1: 90})
    documents = collections.Counter(chosen)
    assert schedule.consumed == [[float(documents[0]), 10.0 * documents[0]], [float(documents[1]), 90.0 * documents[1]]]
    assert schedule.total_tokens == 10 * documents[0] + 90 * documents[1]
    assert abs(schedule.consumed[0][1] / schedule.total_tokens - 0.5) < 0.02
    assert documents[0] > 7 * documents[1]  # the same tokens take far more short documents


def test_the_jitter_is_fixed_by_seed_mixture_name_and_shard_and_renewed_every_block():
    uniforms = _schedule([0.5, 0.5]).block_uniforms(0)
    assert uniforms.shape == (BLOCK_SIZE, 2)
    np.testing.assert_array_equal(uniforms, _schedule([0.5, 0.5]).block_uniforms(0))
    for other in (_schedule([0.5, 0.5]).block_uniforms(1), _schedule([0.5, 0.5], seed=1).block_uniforms(0),
                  _schedule([0.5, 0.5], rank=1, world_size=2).block_uniforms(0),
                  DrawSchedule("other", ["a", "b"], [0.5, 0.5], "documents", StreamSettings()).block_uniforms(0)):
        assert not np.array_equal(uniforms, other)


def test_a_negative_seed_draws_like_its_64_bit_wrap():
    assert _draws(_schedule([0.4, 0.6], seed=-5), 600) == _draws(_schedule([0.4, 0.6], seed=2**64 - 5), 600)


def test_reset_and_load_set_the_counter_and_accounts_and_a_loaded_schedule_draws_on_identically():
    reference = _schedule([0.3, 0.7], mix_by="tokens")
    head = _draws(reference, 300, tokens={0: 3, 1: 5})
    draws, consumed = reference.draws, [list(account) for account in reference.consumed]
    tail = _draws(reference, 300, tokens={0: 3, 1: 5})
    resumed = _schedule([0.3, 0.7], mix_by="tokens")
    resumed.load(draws, consumed)
    assert _draws(resumed, 300, tokens={0: 3, 1: 5}) == tail
    resumed.reset()
    assert (resumed.draws, resumed.consumed, resumed.total_tokens) == (0, [[0.0, 0.0], [0.0, 0.0]], 0.0)
    assert _draws(resumed, 300, tokens={0: 3, 1: 5}) == head


# ---------------------------------------------------------------- accounts in the state and across resumes


def test_accounts_are_saved_by_name_and_unit_and_read_back_only_for_the_same_mix():
    schedule = _schedule([0.5, 0.5], mix_by="tokens")
    _draws(schedule, 50, tokens={0: 2, 1: 4})
    own = {"consumed": schedule.accounts_state(schedule.consumed), "weights": schedule.weights_state(),
           "mix_by": "tokens"}
    assert set(own["consumed"]["a"]) == {"documents", "tokens"}
    assert schedule.saved_accounts(own) == schedule.consumed
    assert _schedule([0.5, 0.5], mix_by="documents").saved_accounts(own) == [[0.0, 0.0], [0.0, 0.0]]
    assert _schedule([0.6, 0.4], mix_by="tokens").saved_accounts(own) == [[0.0, 0.0], [0.0, 0.0]]


def test_merged_accounts_sum_the_shards_and_each_new_shard_takes_an_equal_part():
    old = [_schedule([0.5, 0.5], rank=r, world_size=2) for r in range(2)]
    for schedule, count in zip(old, (10, 31)):
        _draws(schedule, count)
    owns = [{"consumed": s.accounts_state(s.consumed), "weights": s.weights_state()} for s in old]
    merged = old[0].merged_accounts(owns)
    assert {name: account["documents"] for name, account in merged.items()} == {
        name: sum(s.consumed[i][0] for s in old) for i, name in enumerate(("a", "b"))
    }
    new = _schedule([0.5, 0.5], rank=1, world_size=4)
    _draws(new, 5)
    new.take_share({"consumed": merged})
    assert new.draws == 0
    assert new.consumed == [[merged[n]["documents"] / 4, merged[n]["tokens"] / 4] for n in ("a", "b")]


def _lengths_stream(name: str, n: int, mean_length: int, seed: int, rank: int = 0, world_size: int = 1) -> InMemoryStream:
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, rng.lognormal(np.log(mean_length), 0.5, n).astype(int))
    return InMemoryStream([[7] * int(k) for k in lengths], name, seed=seed, rank=rank, world_size=world_size)


def test_token_weights_hold_within_a_hundredth_over_20k_documents_with_20x_longer_documents():
    weights = {"short": 0.3, "long": 0.5, "mid": 0.2}
    children = [_lengths_stream("short", 3000, 20, 1), _lengths_stream("long", 3000, 400, 2),
                _lengths_stream("mid", 3000, 100, 3)]
    ds = InterleavedDataset(children, list(weights.values()), seed=5, mix_by="tokens")
    tokens = collections.Counter()
    for sample in itertools.islice(ds, 20_000):
        tokens[sample["source"]] += len(sample["input_ids"])
    total = sum(tokens.values())
    for name, weight in weights.items():
        assert abs(tokens[name] / total - weight) <= 0.01, (name, tokens[name] / total)
    documents = ds.state_dict()["interleaved"]["consumed"]
    assert documents["short"]["documents"] > 10 * documents["long"]["documents"]  # same tokens, far more docs


def test_token_weighted_mix_resumes_exactly():
    def build():
        return InterleavedDataset([_lengths_stream("s", 500, 10, 1), _lengths_stream("l", 500, 200, 2)], [0.5, 0.5],
                                  seed=3, mix_by="tokens")

    reference = [_key(s) for s in itertools.islice(build(), 900)]
    ds = build()
    head = [_key(s) for s in itertools.islice(ds, 333)]
    resumed = build()
    resumed.load_state_dict(_roundtrip(ds.state_dict()))
    assert head + [_key(s) for s in itertools.islice(resumed, 900 - 333)] == reference


def test_resume_on_fewer_shards_pays_back_what_the_old_shards_owed_each_source():
    old = [_mixture(rank=r, world_size=2) for r in range(2)]
    counts = collections.Counter()
    for stream, draws in zip(old, (13, 29)):  # partial blocks: each shard is a little off its weights
        counts.update(s["source"] for s in itertools.islice(stream, draws))
    merged = _mixture()
    merged.load_shard_states([s.state_dict() for s in old])
    counts.update(s["source"] for s in itertools.islice(merged, 2000 - 42))
    for name, weight in WEIGHTS.items():
        assert abs(counts[name] / 2000 - weight) <= 0.01
    assert merged.state_dict()["interleaved"]["consumed"]["a"]["documents"] == counts["a"]


def test_resume_with_new_weights_follows_them_from_the_resume_on():
    def build(weights):
        return InterleavedDataset([_stream("a", 200), _stream("b", 200)], weights, seed=4)

    old = build([0.9, 0.1])
    list(itertools.islice(old, 1000))
    new = build([0.1, 0.9])
    new.load_state_dict(old.state_dict())
    counts = collections.Counter(s["source"] for s in itertools.islice(new, 200))
    assert abs(counts["a"] / 200 - 0.1) < 0.03  # no payback of the old 0.9 share
