"""InMemoryStream: document samples, per-pass shuffles, sharding, finite passes, exact resume."""

from __future__ import annotations

import json

import io
import itertools

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.memory import InMemoryStream


def _docs(n: int) -> list[list[int]]:
    """``n`` distinct documents; document ``i`` starts with token ``i``."""
    return [[i] + [1000 + i] * (i % 4) for i in range(n)]


def _first_tokens(samples) -> list[int]:
    return [int(s["input_ids"][0]) for s in samples]


def _roundtrip(state: dict) -> dict:
    """Save and load with ``weights_only=True``, as a checkpoint would."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_yields_document_samples_with_int64_ids_source_and_pass_as_epoch():
    stream = InMemoryStream(_docs(3), "docs", seed=0, shuffle=False, num_passes=2)
    samples = list(stream)
    assert len(samples) == 6
    for s in samples:
        assert s["input_ids"].dtype == np.int64 and s["input_ids"].ndim == 1
        assert s["source"] == "docs"
        assert "loss_mask" not in s
    assert [s["epoch"] for s in samples] == [0, 0, 0, 1, 1, 1]
    assert [s["input_ids"].tolist() for s in samples[:3]] == [[0], [1, 1001], [2, 1002, 1002]]


def test_document_dicts_keep_loss_mask_and_extra_fields():
    data = [{"input_ids": [5, 6, 7], "loss_mask": [False, True, True], "id": "a"}]
    (sample,) = list(InMemoryStream(data, "chat", num_passes=1))
    assert sample["loss_mask"].dtype == bool
    assert sample["loss_mask"].tolist() == [False, True, True]
    assert sample["id"] == "a"
    assert sample["source"] == "chat" and sample["epoch"] == 0


def test_yielded_arrays_are_copies_so_consumers_cannot_corrupt_the_data():
    stream = InMemoryStream([[1, 2, 3]], "d", shuffle=False, num_passes=2)
    it = iter(stream)
    first = next(it)
    first["input_ids"][:] = 0
    assert next(it)["input_ids"].tolist() == [1, 2, 3]


def test_each_pass_is_a_permutation_that_is_a_pure_function_of_seed_and_pass():
    n = 40
    a = list(itertools.islice(InMemoryStream(_docs(n), "d", seed=7), 3 * n))
    b = list(itertools.islice(InMemoryStream(_docs(n), "d", seed=7), 3 * n))
    c = list(itertools.islice(InMemoryStream(_docs(n), "d", seed=8), n))
    passes = [_first_tokens(a[p * n : (p + 1) * n]) for p in range(3)]
    for order in passes:
        assert sorted(order) == list(range(n))
    assert passes[0] != passes[1] != passes[2]  # reshuffled every pass
    assert _first_tokens(a) == _first_tokens(b)
    assert _first_tokens(c) != passes[0]
    assert passes[1] == InMemoryStream(_docs(n), "d", seed=7).permutation(1).tolist()


def test_shuffle_false_keeps_input_order_every_pass():
    stream = InMemoryStream(_docs(5), "d", shuffle=False)
    assert _first_tokens(itertools.islice(stream, 10)) == [0, 1, 2, 3, 4] * 2


def test_finite_stream_ends_after_num_passes_and_iterating_again_replays_it():
    stream = InMemoryStream(_docs(6), "d", seed=3, num_passes=2)
    first = _first_tokens(stream)
    assert len(first) == 12
    assert stream.epochs_completed == 2
    assert _first_tokens(stream) == first


def _collect_shard(rank: int, n_docs: int, per_worker: int) -> list[list[int]]:
    """First tokens yielded by each dataloader worker of ``rank`` (2 ranks x 2 workers)."""
    stream = InMemoryStream(_docs(n_docs), "d", seed=11, rank=rank, world_size=2)
    loader = DataLoader(stream, batch_size=None, num_workers=2)
    out = _first_tokens(itertools.islice(loader, 2 * per_worker))
    return [out[0::2], out[1::2]]  # the loader alternates workers in order


def test_ranks_and_workers_get_disjoint_equal_shards_of_every_pass():
    n_docs = 22  # 22 // 4 shards = 5 documents per shard and pass, 2 left out per pass
    shards = _collect_shard(0, n_docs, 5) + _collect_shard(1, n_docs, 5)
    flat = [t for shard in shards for t in shard]
    assert [len(s) for s in shards] == [5, 5, 5, 5]
    assert len(set(flat)) == 20  # no document seen by two shards within a pass
    # the shards are exactly the strided slices of pass 0's global permutation
    perm = InMemoryStream(_docs(n_docs), "d", seed=11).permutation(0)
    assert shards == [perm[k::4][:5].tolist() for k in range(4)]


def test_rank_objects_outside_workers_split_the_pass_between_them():
    r0 = _first_tokens(itertools.islice(InMemoryStream(_docs(10), "d", seed=1, rank=0, world_size=2), 5))
    r1 = _first_tokens(itertools.islice(InMemoryStream(_docs(10), "d", seed=1, rank=1, world_size=2), 5))
    assert sorted(r0 + r1) == list(range(10))


def test_too_few_documents_for_the_shards_is_a_clear_error():
    stream = InMemoryStream(_docs(1), "tiny", rank=0, world_size=2)
    with pytest.raises(ValueError, match="'tiny' has 1 documents but 2 shards"):
        next(iter(stream))


@pytest.mark.parametrize("stop_after", [0, 1, 4, 9, 10, 11, 23, 30])
def test_resume_from_state_at_any_point_continues_identically(stop_after):
    def make() -> InMemoryStream:
        return InMemoryStream(_docs(10), "d", seed=5)

    reference = list(itertools.islice(make(), 45))
    stream = make()
    it = iter(stream)
    consumed = [next(it) for _ in range(stop_after)]
    state = _roundtrip(stream.state_dict())
    resumed = make()
    resumed.load_state_dict(state)
    continued = list(itertools.islice(resumed, 45 - stop_after))
    for got, want in zip(consumed + continued, reference, strict=True):
        assert got["input_ids"].tolist() == want["input_ids"].tolist()
        assert got["epoch"] == want["epoch"]


def test_resume_after_last_sample_of_a_finite_stream_yields_nothing_more():
    stream = InMemoryStream(_docs(4), "d", seed=0, num_passes=1)
    it = iter(stream)
    for _ in range(4):
        next(it)
    resumed = InMemoryStream(_docs(4), "d", seed=0, num_passes=1)
    resumed.load_state_dict(stream.state_dict())
    assert list(resumed) == []


def test_state_is_plain_fresh_and_small():
    stream = InMemoryStream(_docs(1000), "d")
    it = iter(stream)
    for _ in range(2500):
        next(it)
    state = stream.state_dict()
    plan = state["d"]["walk"]["plan"]
    assert (plan["epoch"], plan["tail_taken"], plan["holes"]) == (2, 500, [])
    assert json.loads(json.dumps(state)) == state  # plain, JSON-serialisable
    plan["tail_taken"] = 0  # the caller may keep/mutate what it got
    assert stream.state_dict()["d"]["walk"]["plan"]["tail_taken"] == 500


def test_loading_a_state_of_another_rank_is_refused_instead_of_replaying_documents():
    rank0 = InMemoryStream(_docs(10), "d", rank=0, world_size=2)
    next(iter(rank0))
    single = InMemoryStream(_docs(10), "d")
    with pytest.raises(ValueError, match="shard 0 of 2.*shard 0 of 1.*load_shard_states"):
        single.load_state_dict(rank0.state_dict())


def test_resume_with_fewer_ranks_uses_every_document_of_the_pass_exactly_once():
    old = [InMemoryStream(_docs(40), "d", seed=3, rank=r, world_size=2) for r in range(2)]
    seen = []
    for stream, count in zip(old, (7, 11)):
        it = iter(stream)
        seen += [int(next(it)["source_row"]) for _ in range(count)]
    merged = InMemoryStream(_docs(40), "d", seed=3)
    merged.load_shard_states([s.state_dict() for s in old])
    it = iter(merged)
    seen += [int(next(it)["source_row"]) for _ in range(40 - len(seen))]
    assert sorted(seen) == list(range(40))
    assert next(it)["epoch"] == 1


def test_loading_a_state_written_over_different_data_names_the_stream():
    saved = InMemoryStream(_docs(10), "d").state_dict()
    with pytest.raises(ValueError, match="stream 'd' was written over 10 documents.*holds 11"):
        InMemoryStream(_docs(11), "d").load_state_dict(saved)


def test_loading_state_of_another_stream_lists_what_the_state_holds():
    with pytest.raises(KeyError, match="'d' not found.*\\['other'\\]"):
        InMemoryStream(_docs(3), "d").load_state_dict({"other": {"walk": {}}})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "was given no documents"),
        ([{"text": "hi"}], "document 0 of stream 'bad' is a dict without an 'input_ids'"),
        ([[1, 2], [[1, 2], [3]]], "document 1 of stream 'bad'"),
        ([[0.5, 1.5]], "must hold integer token ids"),
        ([{"input_ids": [1, 2], "loss_mask": [True]}], "'loss_mask' has shape \\(1,\\)"),
    ],
)
def test_bad_documents_fail_at_construction_naming_the_document(data, message):
    with pytest.raises(ValueError, match=message):
        InMemoryStream(data, "bad")


def test_bad_num_passes_and_rank_are_rejected():
    with pytest.raises(ValueError, match="num_passes of stream 'd'"):
        InMemoryStream(_docs(3), "d", num_passes=0)
    with pytest.raises(ValueError, match="rank=2, world_size=2"):
        InMemoryStream(_docs(3), "d", rank=2, world_size=2)


def test_empty_documents_are_skipped_and_counted_and_an_all_empty_shard_is_an_error():
    stream = InMemoryStream([[1], [], [2, 2]], "gaps", shuffle=False)
    iterator = iter(stream)
    assert [next(iterator)["input_ids"].tolist() for _ in range(4)] == [[1], [2, 2], [1], [2, 2]]
    assert stream.counters["empty_skipped"] == 2  # one per pass, as an ArrowSource counts them
    resumed = InMemoryStream([[1], [], [2, 2]], "gaps", shuffle=False)
    resumed.load_state_dict(stream.state_dict())
    assert resumed.counters["empty_skipped"] == 2
    with pytest.raises(RuntimeError, match="Stream 'blank'.*shard 0 of 1.*all empty"):
        next(iter(InMemoryStream([[], []], "blank")))


def test_settings_give_the_same_samples_and_state_as_the_keywords():
    options = dict(seed=-5, num_passes=2, rank=1, world_size=2)
    by_keywords = InMemoryStream(_docs(23), "d", **options)
    by_settings = InMemoryStream(_docs(23), "d", settings=StreamSettings(**options))
    got, want = list(by_settings), list(by_keywords)
    assert [(s["source_row"], s["epoch"], s["input_ids"].tolist()) for s in got] == [
        (s["source_row"], s["epoch"], s["input_ids"].tolist()) for s in want]
    assert by_settings.state_dict() == by_keywords.state_dict()
    assert (by_settings.rank, by_settings.world_size) == (1, 2)
    with pytest.raises(ValueError, match="Source 'd': seed given both"):
        InMemoryStream(_docs(3), "d", seed=1, settings=StreamSettings(seed=1))


def test_a_resume_on_another_layout_carries_the_summed_empty_count_on():
    docs = [[1], [], [2], [], [3], [4], [], [5]]
    shards = [InMemoryStream(docs, "gaps", shuffle=False, rank=rank, world_size=2) for rank in range(2)]
    for shard in shards:
        iterator = iter(shard)
        for _ in range(3):
            next(iterator)
    states = [shard.state_dict() for shard in shards]
    # shard 0 read [1], [2], [3]; shard 1 skipped two empties per pass on its way to [4], [5], [4]
    assert [s["gaps"]["counters"]["empty_skipped"] for s in states] == [0, 4]
    single = InMemoryStream(docs, "gaps", shuffle=False)
    single.load_global_state(single.merge_shard_states(states))
    assert single.state_dict()["gaps"]["counters"]["empty_skipped"] == 4
