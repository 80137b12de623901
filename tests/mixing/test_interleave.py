"""InterleavedDataset: weights, stopping strategies, sharding, exact resume."""

from __future__ import annotations

import collections
import io
import itertools
import logging

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_tune_data.mixing.interleave import InterleavedDataset
from lightning_tune_data.sources.memory import InMemoryStream

WEIGHTS = {"a": 0.7, "b": 0.2, "c": 0.1}


def _stream(name: str, n: int, *, seed: int = 0, num_passes: int | None = None, rank: int = 0,
            world_size: int = 1, shuffle: bool = True) -> InMemoryStream:
    """``n`` documents ``[k, k]`` with ``k`` unique per (name, index)."""
    base = {"a": 0, "b": 10_000, "c": 20_000, "d": 30_000, "x": 40_000, "y": 50_000}[name]
    return InMemoryStream([[base + i, base + i] for i in range(n)], name, seed=seed, shuffle=shuffle,
                          num_passes=num_passes, rank=rank, world_size=world_size)


def _mixture(rank: int = 0, world_size: int = 1, seed: int = 123) -> InterleavedDataset:
    children = [_stream(n, 64, seed=i, rank=rank, world_size=world_size) for i, n in enumerate(WEIGHTS)]
    return InterleavedDataset(children, list(WEIGHTS.values()), seed=seed, rank=rank, world_size=world_size)


def _roundtrip(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _key(sample: dict) -> tuple:
    return (sample["source"], sample["epoch"], tuple(sample["input_ids"].tolist()))


def _sources(batch: list[dict]) -> list[str]:
    return [sample["source"] for sample in batch]


def _assert_shares(sources: list[str], tol: float = 0.01) -> None:
    counts = collections.Counter(sources)
    for name, w in WEIGHTS.items():
        assert abs(counts[name] / len(sources) - w) <= tol, (name, counts, len(sources))


# ---------------------------------------------------------------- weights and sharding


def test_realised_shares_track_weights_per_shard_and_in_total_over_2_ranks_x_2_workers():
    per_shard = 5_000  # 4 shards x 5,000 = 20,000 draws
    shards = []
    for rank in (0, 1):
        # batches of 500 sources; the loader alternates its workers batch by batch
        loader = DataLoader(_mixture(rank=rank, world_size=2), batch_size=500, num_workers=2,
                            collate_fn=_sources)
        batches = list(itertools.islice(loader, 2 * per_shard // 500))
        shards += [sum(batches[0::2], []), sum(batches[1::2], [])]
    for sources in shards:
        assert len(sources) == per_shard
        _assert_shares(sources)
    _assert_shares([s for shard in shards for s in shard])
    # every (rank, worker) draws its own sequence: no two shards repeat each other
    assert len({tuple(s[:200]) for s in shards}) == 4


def test_realised_shares_track_weights_for_rank_objects_in_the_main_process():
    for rank in (0, 1):
        sources = [s["source"] for s in itertools.islice(_mixture(rank=rank, world_size=2), 10_000)]
        _assert_shares(sources)


def test_same_seed_same_sequence_and_different_seed_different_sequence():
    first = [_key(s) for s in itertools.islice(_mixture(seed=1), 300)]
    again = [_key(s) for s in itertools.islice(_mixture(seed=1), 300)]
    other = [_key(s) for s in itertools.islice(_mixture(seed=2), 300)]
    assert first == again
    assert first != other


def test_weights_are_normalised_with_a_warning_and_exposed_by_name(caplog):
    with caplog.at_level(logging.WARNING, logger="lightning_tune_data.mixing.interleave"):
        ds = InterleavedDataset([_stream("a", 4), _stream("b", 4)], [3, 1], seed=0)
    assert ds.weights == {"a": 0.75, "b": 0.25}
    assert "normalised weights" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lightning_tune_data.mixing.interleave"):
        InterleavedDataset([_stream("a", 4), _stream("b", 4)], [0.5, 0.5], seed=0)
    assert caplog.text == ""


def test_zero_weight_child_is_never_drawn_in_an_infinite_mixture():
    ds = InterleavedDataset([_stream("a", 4), _stream("b", 4)], [1.0, 0.0], seed=0)
    assert {s["source"] for s in itertools.islice(ds, 500)} == {"a"}


# ---------------------------------------------------------------- validation


def test_duplicate_child_names_are_rejected_listing_the_duplicates():
    with pytest.raises(ValueError, match=r"duplicate child dataset names \['a'\]"):
        InterleavedDataset([_stream("a", 4), _stream("b", 4), _stream("a", 5)], [1, 1, 1], seed=0)


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf"), "0.5", None])
def test_invalid_weight_is_rejected_naming_the_child(bad):
    with pytest.raises(ValueError, match=rf"weight .* of child 'b' is invalid"):
        InterleavedDataset([_stream("a", 4), _stream("b", 4)], [1.0, bad], seed=0)


def test_weights_summing_to_zero_length_mismatch_and_unknown_strategy_are_rejected():
    with pytest.raises(ValueError, match="sum to 0"):
        InterleavedDataset([_stream("a", 4), _stream("b", 4)], [0, 0], seed=0)
    with pytest.raises(ValueError, match="2 datasets but 1 weights"):
        InterleavedDataset([_stream("a", 4), _stream("b", 4)], [1.0], seed=0)
    with pytest.raises(ValueError, match="unknown stopping_strategy 'oversample'"):
        InterleavedDataset([_stream("a", 4)], [1.0], seed=0, stopping_strategy="oversample")
    with pytest.raises(ValueError, match="at least one child"):
        InterleavedDataset([], [], seed=0)


# ---------------------------------------------------------------- stopping strategies


def _finite(lengths: dict[str, int]) -> list[InMemoryStream]:
    return [_stream(n, k, seed=i, num_passes=1) for i, (n, k) in enumerate(lengths.items())]


def test_all_exhausted_yields_every_sample_exactly_once_with_each_source_in_order():
    lengths = {"a": 5, "b": 10, "c": 3}
    ds = InterleavedDataset(_finite(lengths), [0.6, 0.3, 0.1], seed=4, stopping_strategy="all_exhausted")
    out = list(ds)
    assert len(out) == 18
    expected = {s["input_ids"][0] for child in _finite(lengths) for s in child}
    assert sorted(s["input_ids"][0] for s in out) == sorted(expected)
    for child in _finite(lengths):  # interleaving keeps each source's own order
        assert [s["input_ids"][0] for s in out if s["source"] == child.dataset_name] == [
            s["input_ids"][0] for s in child
        ]


def test_all_exhausted_renormalises_so_a_zero_weight_child_comes_after_the_others():
    ds = InterleavedDataset([_stream("a", 5, shuffle=False, num_passes=1),
                             _stream("b", 4, shuffle=False, num_passes=1)],
                            [1.0, 0.0], seed=0, stopping_strategy="all_exhausted")
    assert [int(s["input_ids"][0]) for s in ds] == [0, 1, 2, 3, 4, 10_000, 10_001, 10_002, 10_003]


def test_first_exhausted_stops_at_the_first_exhausted_child_exactly():
    ds = InterleavedDataset([_stream("a", 5, shuffle=False, num_passes=1),
                             _stream("b", 4, shuffle=False, num_passes=1)],
                            [1.0, 0.0], seed=0, stopping_strategy="first_exhausted")
    assert [int(s["input_ids"][0]) for s in ds] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("seed", range(5))
def test_first_exhausted_stops_at_the_first_draw_of_an_exhausted_child(seed):
    lengths = {"a": 30, "b": 8, "c": 12}
    ds = InterleavedDataset(_finite(lengths), [0.5, 0.3, 0.2], seed=seed, stopping_strategy="first_exhausted")
    out = list(ds)
    counts = collections.Counter(s["source"] for s in out)
    state = ds.state_dict()["interleaved"]
    (ended,) = [n for n, done in state["exhausted"].items() if done]
    assert counts[ended] == lengths[ended]  # the child that ended was fully consumed ...
    assert all(counts[n] <= lengths[n] for n in lengths)
    assert state["draws"] == len(out) + 1  # ... and the very next draw of it stopped the stream
    assert state["children"][ended]["walk"]["plan"]["epoch"] == 1


def test_infinite_strategy_restarts_a_finite_child_with_a_warning(caplog):
    ds = InterleavedDataset([_stream("a", 3, num_passes=1), _stream("b", 100)], [0.5, 0.5], seed=0)
    with caplog.at_level(logging.WARNING, logger="lightning_tune_data.mixing.interleave"):
        out = list(itertools.islice(ds, 60))
    assert sum(s["source"] == "a" for s in out) > 3
    assert "child 'a' ended" in caplog.text


def test_a_finished_finite_mixture_replays_from_the_start_when_iterated_again():
    ds = InterleavedDataset(_finite({"a": 5, "b": 7}), [0.5, 0.5], seed=9, stopping_strategy="all_exhausted")
    assert [_key(s) for s in ds] == [_key(s) for s in ds]


# ---------------------------------------------------------------- state


def _nested(rank: int = 0) -> InterleavedDataset:
    inner = InterleavedDataset([_stream("x", 7, seed=5), _stream("y", 9, seed=6)], [0.5, 0.5], seed=1,
                               dataset_name="inner")
    return InterleavedDataset([_stream("a", 11, seed=2), inner], [0.4, 0.6], seed=1, rank=rank)


def _finite_all() -> InterleavedDataset:
    return InterleavedDataset(_finite({"a": 9, "b": 30, "c": 4}), [0.5, 0.3, 0.2], seed=3,
                              stopping_strategy="all_exhausted")


@pytest.mark.parametrize("make", [_mixture, _nested, _finite_all], ids=["flat", "nested", "all_exhausted"])
@pytest.mark.parametrize("stop_after", [0, 1, 17, 40, 255, 256, 300])
def test_resume_at_any_point_equals_the_uninterrupted_stream(make, stop_after):
    total = 420
    reference = [_key(s) for s in itertools.islice(make(), total)]
    stop_after = min(stop_after, len(reference))  # the finite mixture has 43 samples
    ds = make()
    it = iter(ds)
    head = [_key(s) for s in itertools.islice(it, stop_after)]
    state = _roundtrip(ds.state_dict())
    list(itertools.islice(it, 5))  # the original keeps going; the saved state must not change
    resumed = make()
    resumed.load_state_dict(state)
    tail = [_key(s) for s in itertools.islice(resumed, total - stop_after)]
    assert head + tail == reference


@pytest.mark.parametrize("make", [_mixture, _nested, _finite_all], ids=["flat", "nested", "all_exhausted"])
def test_snapshot_built_later_equals_the_state_of_its_moment(make):
    ds = make()
    it = iter(ds)
    moments = []
    for _ in range(60):
        moments.append((ds.snapshot(), _roundtrip(ds.state_dict())))
        next(it, None)
    for snapshot, expected in moments:
        assert _roundtrip(snapshot()) == expected
    assert moments[0][1] != moments[-1][1]


def test_resume_from_a_finished_finite_mixture_replays_like_the_original_object():
    ds = _finite_all()
    first = [_key(s) for s in ds]
    resumed = _finite_all()
    resumed.load_state_dict(ds.state_dict())
    assert [_key(s) for s in resumed] == [_key(s) for s in ds] == first


def test_resume_through_a_stateful_dataloader_with_two_workers_is_exact():
    def loader() -> StatefulDataLoader:
        return StatefulDataLoader(_mixture(rank=1, world_size=2), batch_size=None, num_workers=2)

    reference = [_key(s) for s in itertools.islice(loader(), 300)]
    original = loader()
    it = iter(original)
    head = [_key(next(it)) for _ in range(123)]
    state = _roundtrip(original.state_dict())
    resumed = loader()
    resumed.load_state_dict(state)
    tail = [_key(s) for s in itertools.islice(resumed, 300 - 123)]
    assert head + tail == reference


def test_state_has_draws_flags_weights_and_each_child_state_by_name():
    ds = _nested()
    list(itertools.islice(ds, 10))
    state = ds.state_dict()
    own = state["interleaved"]
    assert set(state) == {"interleaved"}
    assert own["draws"] == 10
    assert own["exhausted"] == {"a": False, "inner": False}
    assert own["weights"] == {"a": 0.4, "inner": 0.6}
    assert set(own["children"]) == {"a", "inner"}
    assert set(own["children"]["inner"]["children"]) == {"x", "y"}
    own["draws"] = 0
    assert ds.state_dict()["interleaved"]["draws"] == 10  # fresh containers


def test_state_size_does_not_grow_with_the_number_of_draws():
    ds = _mixture()
    it = iter(ds)
    list(itertools.islice(it, 10))
    small = len(repr(ds.state_dict()))
    list(itertools.islice(it, 20_000))
    assert len(repr(ds.state_dict())) <= small + 80  # only counters and accounts get more digits


def test_loading_a_state_without_a_child_names_the_missing_child():
    saved = InterleavedDataset([_stream("a", 4), _stream("b", 4)], [1, 1], seed=0).state_dict()
    other = InterleavedDataset([_stream("a", 4), _stream("c", 4)], [1, 1], seed=0)
    with pytest.raises(KeyError, match=r"children \['c'\]"):
        other.load_state_dict(saved)


def test_loading_a_state_with_other_weights_warns(caplog):
    saved = InterleavedDataset([_stream("a", 4), _stream("b", 4)], [0.5, 0.5], seed=0).state_dict()
    ds = InterleavedDataset([_stream("a", 4), _stream("b", 4)], [0.9, 0.1], seed=0)
    with caplog.at_level(logging.WARNING, logger="lightning_tune_data.mixing.interleave"):
        ds.load_state_dict(saved)
    assert "written with weights" in caplog.text


# ---------------------------------------------------------------- token weights and elastic accounts


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


def test_mix_by_must_be_documents_or_tokens():
    with pytest.raises(ValueError, match="mix_by='bytes'"):
        InterleavedDataset([_stream("a", 4)], [1.0], seed=0, mix_by="bytes")


def test_resume_with_new_weights_follows_them_from_the_resume_on():
    def build(weights):
        return InterleavedDataset([_stream("a", 200), _stream("b", 200)], weights, seed=4)

    old = build([0.9, 0.1])
    list(itertools.islice(old, 1000))
    new = build([0.1, 0.9])
    new.load_state_dict(old.state_dict())
    counts = collections.Counter(s["source"] for s in itertools.islice(new, 200))
    assert abs(counts["a"] / 200 - 0.1) < 0.03  # no payback of the old 0.9 share
