"""InterleavedDataset: shares across shards, argument checks, settings, exact resume and its state."""

from __future__ import annotations

import collections
import itertools

import numpy as np
import pyarrow as pa
import pytest
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_tune_data.mixing.interleave import InterleavedDataset
from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.arrow import ArrowSource
from lightning_tune_data.sources.memory import InMemoryStream
from mixtures import WEIGHTS
from mixtures import key as _key
from mixtures import mixture as _mixture
from mixtures import roundtrip as _roundtrip
from mixtures import stream as _stream


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


# ---------------------------------------------------------------- validation


def test_weights_summing_to_zero_length_mismatch_and_unknown_strategy_are_rejected():
    with pytest.raises(ValueError, match="sum to 0"):
        InterleavedDataset([_stream("a", 4), _stream("b", 4)], [0, 0], seed=0)
    with pytest.raises(ValueError, match="2 datasets but 1 weights"):
        InterleavedDataset([_stream("a", 4), _stream("b", 4)], [1.0], seed=0)
    with pytest.raises(ValueError, match="unknown stopping_strategy 'oversample'"):
        InterleavedDataset([_stream("a", 4)], [1.0], seed=0, stopping_strategy="oversample")
    with pytest.raises(ValueError, match="at least one child"):
        InterleavedDataset([], [], seed=0)


def test_mix_by_must_be_documents_or_tokens():
    with pytest.raises(ValueError, match="mix_by='bytes'"):
        InterleavedDataset([_stream("a", 4)], [1.0], seed=0, mix_by="bytes")


def test_rank_outside_world_size_is_rejected_naming_both():
    with pytest.raises(ValueError, match="need 0 <= rank < world_size, got rank=2, world_size=2"):
        InterleavedDataset([_stream("a", 4)], [1.0], seed=0, rank=2, world_size=2)
    with pytest.raises(ValueError, match="got rank=0, world_size=0"):
        InterleavedDataset([_stream("a", 4)], [1.0], seed=0, world_size=0)


# ---------------------------------------------------------------- settings


def _arrow_children(rank: int, world_size: int) -> list[ArrowSource]:
    tables = {name: pa.table({"input_ids": pa.array([[k] * (1 + (k * 7) % 40) for k in range(base, base + 90)],
                                                    type=pa.list_(pa.int32()))})
              for name, base in (("web", 0), ("code", 1000))}
    return [ArrowSource(table, name, seed=2, rank=rank, world_size=world_size) for name, table in tables.items()]


def test_settings_give_bitwise_the_stream_and_states_the_keywords_give():
    for rank, world_size in ((0, 1), (1, 2), (2, 3)):
        by_keywords = InterleavedDataset(_arrow_children(rank, world_size), [0.6, 0.4], seed=-17, rank=rank,
                                         world_size=world_size, mix_by="tokens")
        settings = StreamSettings(seed=-17, rank=rank, world_size=world_size)
        by_settings = InterleavedDataset(_arrow_children(rank, world_size), [0.6, 0.4], settings=settings,
                                         mix_by="tokens")
        assert by_settings.settings is settings and by_keywords.settings == settings
        assert (by_settings.rank, by_settings.world_size) == (rank, world_size)
        for a, b in zip(itertools.islice(by_keywords, 700), itertools.islice(by_settings, 700), strict=True):
            assert _key(a) == _key(b) and a["source_row"] == b["source_row"]
            assert a["input_ids"].dtype == b["input_ids"].dtype
        assert by_keywords.state_dict() == by_settings.state_dict()
        # the packer's block path draws the same too
        blocks = [ds.read_block(300) for ds in (by_keywords, by_settings)]
        assert blocks[0].refs == blocks[1].refs
        for a, b in zip(*(block.input_ids for block in blocks), strict=True):
            np.testing.assert_array_equal(a, b)
        assert by_keywords.state_after_block(blocks[0], 123) == by_settings.state_after_block(blocks[1], 123)


def test_settings_with_contradicting_keywords_or_no_seed_at_all_are_refused():
    settings = StreamSettings(seed=3, rank=1, world_size=2)
    same = InterleavedDataset([_stream("a", 4, rank=1, world_size=2)], [1.0], seed=3, rank=1, world_size=2,
                              settings=settings)
    assert same.settings is settings
    with pytest.raises(ValueError, match=r"\{'seed': 4\} contradict settings"):
        InterleavedDataset([_stream("a", 4)], [1.0], seed=4, settings=settings)
    with pytest.raises(ValueError, match=r"\{'rank': 0, 'world_size': 1\} contradict settings"):
        InterleavedDataset([_stream("a", 4)], [1.0], rank=0, world_size=1, settings=settings)
    with pytest.raises(TypeError, match="needs a seed"):
        InterleavedDataset([_stream("a", 4)], [1.0])


# ---------------------------------------------------------------- state


def _nested(rank: int = 0) -> InterleavedDataset:
    inner = InterleavedDataset([_stream("x", 7, seed=5), _stream("y", 9, seed=6)], [0.5, 0.5], seed=1,
                               dataset_name="inner")
    return InterleavedDataset([_stream("a", 11, seed=2), inner], [0.4, 0.6], seed=1, rank=rank)


def _finite(lengths: dict[str, int]) -> list[InMemoryStream]:
    return [_stream(n, k, seed=i, num_passes=1) for i, (n, k) in enumerate(lengths.items())]


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
