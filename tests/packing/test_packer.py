"""IterablePackedDataset: packed-sample format, labels, strategies, overlong policy, exact resume."""

from __future__ import annotations

import io
import itertools
import json

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_tune_data.mixing.interleave import InterleavedDataset
from lightning_tune_data.sources.memory import InMemoryStream
from lightning_tune_data.packing.packer import IterablePackedDataset

STRATEGIES = ["greedy", "best_fit", "concat"]
ARRAY_KEYS = ["input_ids", "labels", "position_ids", "document_ids"]


def _random_docs(n: int, seed: int, max_len: int = 40, base: int = 0, with_mask: bool = False) -> list:
    """Documents with distinct token ids (``base + 1000*i + j``); optionally a random loss mask."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        length = int(rng.integers(1, max_len + 1))
        ids = base + 1000 * i + np.arange(length)
        if with_mask:
            docs.append({"input_ids": ids, "loss_mask": rng.random(length) < 0.7})
        else:
            docs.append(ids)
    return docs


def _lognormal_lengths(n: int, mean: float = 300.0, sigma: float = 1.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mu = np.log(mean) - sigma**2 / 2  # E[lognormal] = exp(mu + sigma^2 / 2) = mean
    return np.maximum(1, np.round(rng.lognormal(mu, sigma, n))).astype(np.int64)


def _roundtrip(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def _assert_same_packs(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for key in ARRAY_KEYS:
            assert g[key].dtype == w[key].dtype and np.array_equal(g[key], w[key]), key
        assert g["seq_lens"] == w["seq_lens"]
        assert g["provenance"] == w["provenance"]


def _check_pack_invariants(pack: dict, max_seq_len: int) -> None:
    n = len(pack["input_ids"])
    assert 0 < n <= max_seq_len
    for key in ARRAY_KEYS:
        assert pack[key].dtype == np.int64 and pack[key].shape == (n,), key
    assert sum(pack["seq_lens"]) == n
    assert [p["tokens"] for p in pack["provenance"]] == pack["seq_lens"]
    starts = np.cumsum([0] + pack["seq_lens"][:-1])
    for k, (start, length) in enumerate(zip(starts, pack["seq_lens"])):
        assert pack["position_ids"][start : start + length].tolist() == list(range(length))
        assert (pack["document_ids"][start : start + length] == k).all()


# ---------------------------------------------------------------- format and labels


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_packs_are_unpadded_int64_arrays_with_restarting_positions_and_document_ids(strategy):
    stream = InMemoryStream(_random_docs(200, 1), "src", seed=0, num_passes=1)
    packs = list(IterablePackedDataset(stream, 64, strategy=strategy))
    assert packs
    for pack in packs:
        _check_pack_invariants(pack, 64)
        assert {p["source"] for p in pack["provenance"]} == {"src"}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_label_is_the_next_target_token_of_the_same_document_or_ignored(strategy):
    docs = _random_docs(150, 2, max_len=50, with_mask=True)
    by_first_token = {int(d["input_ids"][0]): d for d in docs}
    stream = InMemoryStream(docs, "masked", seed=3, num_passes=1)
    checked = 0
    for pack in IterablePackedDataset(stream, 48, strategy=strategy):
        ids, labels = pack["input_ids"], pack["labels"]
        start = 0
        for length in pack["seq_lens"]:
            # token ids are base + 1000*doc + offset: recover the document and the offset
            doc = by_first_token[int(ids[start]) - int(ids[start]) % 1000]
            offset = int(ids[start]) % 1000
            for i in range(length):
                pos = offset + i
                if i == length - 1:
                    expected = -100  # no label crosses the end of a document (piece)
                elif doc["loss_mask"][pos + 1]:
                    expected = int(doc["input_ids"][pos + 1])
                else:
                    expected = -100
                assert labels[start + i] == expected, (strategy, start + i)
                checked += 1
            start += length
    assert checked == sum(min(len(d["input_ids"]), 48) if strategy != "concat" else len(d["input_ids"])
                          for d in docs)


# ---------------------------------------------------------------- strategies


def _flat_docs(packs: list[dict]) -> list[list[int]]:
    out = []
    for pack in packs:
        start = 0
        for length in pack["seq_lens"]:
            out.append(pack["input_ids"][start : start + length].tolist())
            start += length
    return out


def test_greedy_is_next_fit_and_keeps_document_order():
    docs = [np.full(n, i) for i, n in enumerate([3, 4, 2, 5, 1, 6])]
    stream = InMemoryStream(docs, "d", shuffle=False, num_passes=1)
    packs = list(IterablePackedDataset(stream, 8, strategy="greedy"))
    assert [p["seq_lens"] for p in packs] == [[3, 4], [2, 5, 1], [6]]
    assert _flat_docs(packs) == [d.tolist() for d in docs]


def test_best_fit_puts_each_document_in_the_tightest_open_pack_and_emits_the_fullest():
    docs = [np.full(n, i) for i, n in enumerate([5, 6, 3, 2, 7, 1])]
    stream = InMemoryStream(docs, "d", shuffle=False, num_passes=1)
    packs = list(IterablePackedDataset(stream, 8, strategy="best_fit", buffer_size=2))
    # 5 -> A; 6 -> B; 3 fits A (free 3) -> A full, emitted; 2 fits B (free 2) -> B full, emitted;
    # 7 -> C; 1 -> C full, emitted
    assert [p["seq_lens"] for p in packs] == [[5, 3], [6, 2], [7, 1]]


def test_best_fit_emits_the_fullest_open_pack_when_the_buffer_overflows():
    docs = [np.full(n, i) for i, n in enumerate([5, 6, 7, 4])]
    stream = InMemoryStream(docs, "d", shuffle=False, num_passes=1)
    packs = list(IterablePackedDataset(stream, 8, strategy="best_fit", buffer_size=2))
    # 5 -> A, 6 -> B, 7 -> C: three open > 2, the fullest (C, 7) goes; 4 -> new D: A, B, D open,
    # the fullest (B, 6) goes; at the end the rest are flushed oldest first.
    assert [p["seq_lens"] for p in packs] == [[7], [6], [5], [4]]


@pytest.mark.parametrize("strategy", ["greedy", "best_fit"])
def test_greedy_and_best_fit_never_split_a_document_and_lose_none(strategy):
    docs = _random_docs(300, 4, max_len=64)
    stream = InMemoryStream(docs, "d", seed=1, num_passes=1)
    packs = list(IterablePackedDataset(stream, 64, strategy=strategy))
    assert sorted(map(tuple, _flat_docs(packs))) == sorted(tuple(d.tolist()) for d in docs)
    assert all(p["new_document"] for pack in packs for p in pack["provenance"])


def test_concat_cuts_full_blocks_carrying_leftovers_without_dropping_tokens():
    docs = _random_docs(120, 5, max_len=90)
    stream = InMemoryStream(docs, "d", shuffle=False, num_passes=1)
    packs = list(IterablePackedDataset(stream, 64, strategy="concat"))
    assert all(len(p["input_ids"]) == 64 for p in packs[:-1])
    assert np.array_equal(np.concatenate([p["input_ids"] for p in packs]), np.concatenate(docs))
    # a piece continuing a document from the previous pack is marked and restarts its positions
    for prev, pack in zip(packs, packs[1:]):
        first = pack["provenance"][0]
        continued = int(pack["input_ids"][0]) % 1000 != 0
        assert first["new_document"] is (not continued)
        assert pack["position_ids"][0] == 0
        if continued:
            assert int(prev["input_ids"][-1]) + 1 == int(pack["input_ids"][0])
            assert prev["labels"][-1] == -100


def test_concat_splits_a_document_longer_than_several_blocks():
    stream = InMemoryStream([np.arange(10), np.arange(100, 130)], "d", shuffle=False, num_passes=1)
    packs = list(IterablePackedDataset(stream, 8, strategy="concat"))
    assert [p["seq_lens"] for p in packs] == [[8], [2, 6], [8], [8], [8]]
    assert [[d["new_document"] for d in p["provenance"]] for p in packs] == [
        [True], [False, True], [False], [False], [False]]


def test_best_fit_reaches_99_percent_of_tokens_on_lognormal_lengths_packed_to_2048():
    lengths = _lognormal_lengths(20_000)
    assert 280 <= lengths.mean() <= 320
    docs = [np.ones(n, dtype=np.int64) for n in lengths]
    stream = InMemoryStream(docs, "lognormal", seed=0, num_passes=1)
    packer = IterablePackedDataset(stream, 2048, strategy="best_fit")
    packs = list(packer)
    efficiency = sum(len(p["input_ids"]) for p in packs) / (len(packs) * 2048)
    assert efficiency >= 0.99, efficiency
    assert packer.counters["overlong_truncated"] == int((lengths > 2048).sum())


# ---------------------------------------------------------------- overlong and empty documents


@pytest.mark.parametrize("strategy", ["greedy", "best_fit"])
def test_overlong_documents_are_truncated_or_dropped_and_counted(strategy):
    docs = [np.arange(5), np.arange(100, 120), np.arange(200, 203), np.arange(300, 311)]
    truncating = IterablePackedDataset(InMemoryStream(docs, "d", shuffle=False, num_passes=1), 10,
                                       strategy=strategy, overlong="truncate")
    kept = _flat_docs(list(truncating))
    assert sorted(kept) == sorted([list(range(5)), list(range(100, 110)), [200, 201, 202],
                                   list(range(300, 310))])
    assert truncating.counters["overlong_truncated"] == 2
    assert truncating.counters["overlong_dropped"] == 0

    dropping = IterablePackedDataset(InMemoryStream(docs, "d", shuffle=False, num_passes=1), 10,
                                     strategy=strategy, overlong="drop")
    assert sorted(_flat_docs(list(dropping))) == sorted([list(range(5)), [200, 201, 202]])
    assert dropping.counters["overlong_dropped"] == 2
    assert dropping.counters["overlong_truncated"] == 0
    assert dropping.state_dict()["packed_d"]["counters"]["overlong_dropped"] == 2


def test_a_truncated_document_ends_with_an_ignored_label():
    stream = InMemoryStream([np.arange(20)], "d", num_passes=1)
    (pack,) = list(IterablePackedDataset(stream, 8, strategy="greedy"))
    assert pack["input_ids"].tolist() == list(range(8))
    assert pack["labels"].tolist() == list(range(1, 8)) + [-100]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_empty_documents_are_dropped_and_counted(strategy):
    class Fixed(InMemoryStream):  # a user stream that does yield an empty document
        def __iter__(self):
            for ids in ([1, 2], [], [3]):
                yield {"input_ids": np.asarray(ids, dtype=np.int64), "source": "d", "epoch": 0}

    packer = IterablePackedDataset(Fixed([[1]], "d"), 8, strategy=strategy)
    assert _flat_docs(list(packer)) == [[1, 2], [3]]
    assert packer.counters["empty_dropped"] == 1
    from_sources = IterablePackedDataset(InMemoryStream([[1, 2], [], [3]], "d", shuffle=False, num_passes=1), 8,
                                         strategy=strategy)
    assert _flat_docs(list(from_sources)) == [[1, 2], [3]]  # sources skip empty documents themselves


# ---------------------------------------------------------------- exact resume


def _make_interleaved() -> InterleavedDataset:
    a = InMemoryStream(_random_docs(40, 6, max_len=30, with_mask=True), "a", seed=1)
    b = InMemoryStream(_random_docs(25, 7, max_len=70, base=100_000), "b", seed=2)
    return InterleavedDataset([a, b], [0.6, 0.4], seed=3)


def _make_finite() -> InMemoryStream:
    return InMemoryStream(_random_docs(60, 8, max_len=50), "f", seed=4, num_passes=2)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("source", ["interleaved", "finite"])
@pytest.mark.parametrize("stop_after", [0, 1, 7, 23, 50, -3, -1])
def test_resume_after_k_packs_continues_with_exactly_the_same_packs(strategy, source, stop_after):
    """``stop_after < 0`` counts from the end (the finite source then stops inside the final flush)."""
    def make() -> IterablePackedDataset:
        child = _make_interleaved() if source == "interleaved" else _make_finite()
        return IterablePackedDataset(child, 48, strategy=strategy, buffer_size=8)

    total = 80
    reference = list(itertools.islice(make(), total))
    stop_after = min(stop_after, len(reference))  # the finite source packs into fewer than 80
    if stop_after < 0:
        stop_after += len(reference)
    packer = make()
    it = iter(packer)
    head = [next(it) for _ in range(stop_after)]
    state = _roundtrip(packer.state_dict())
    next(it, None)  # the original moves on; the saved state must be unaffected
    resumed = make()
    resumed.load_state_dict(state)
    tail = list(itertools.islice(resumed, total - stop_after))
    _assert_same_packs(head + tail, reference)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_state_holds_buffered_documents_by_reference_never_tokens(strategy):
    packer = IterablePackedDataset(_make_interleaved(), 48, strategy=strategy, buffer_size=8)
    list(itertools.islice(packer, 10))
    own = packer.state_dict()["packed_interleaved"]
    assert own["counters"]["packs"] == 10
    assert set(own["child"]) == {"interleaved"}
    packs = own["packs"]
    assert packs["pack_pieces"]  # some documents wait in the buffer
    assert packs["inline"] == {}  # every piece can be re-read from its source
    assert sum(packs["pack_pieces"]) == len(packs["row"]) == len(packs["length"]) == len(packs["source"])
    assert all(row >= 0 for row in packs["row"])
    assert json.loads(json.dumps(own)) == own  # plain types only
    if strategy == "best_fit":
        assert own["num_open"] <= 8


@pytest.mark.parametrize("strategy", ["greedy", "best_fit", "concat"])
def test_state_size_does_not_depend_on_max_seq_len_beyond_the_number_of_pieces(strategy):
    small, large = (IterablePackedDataset(_make_interleaved(), n, strategy=strategy, buffer_size=8) for n in (48, 4800))
    list(itertools.islice(small, 3))
    list(itertools.islice(large, 3))
    per_piece = [len(json.dumps(p.state_dict())) / max(1, len(p.state_dict()[p.dataset_name]["packs"]["row"]))
                 for p in (small, large)]
    assert per_piece[1] < 2 * per_piece[0] + 200


@pytest.mark.parametrize("strategy", ["greedy", "best_fit", "concat"])
def test_resume_on_more_shards_packs_every_held_and_unread_document_exactly_once(strategy):
    def packer(rank, world_size):
        children = [InMemoryStream([[k, k + 1, k + 2][: 1 + k % 3] * (1 + k % 5) for k in range(base, base + 60)], name,
                                   seed=2, rank=rank, world_size=world_size)
                    for name, base in (("a", 1000), ("b", 5000))]
        mix = InterleavedDataset(children, [0.5, 0.5], seed=1, rank=rank, world_size=world_size)
        return IterablePackedDataset(mix, 16, strategy=strategy, buffer_size=4)

    def documents(packs):  # (source, first token) of each new document, plus tokens of every piece
        return [(p["source"], int(pack["input_ids"][sum(pack["seq_lens"][:i])]))
                for pack in packs for i, p in enumerate(pack["provenance"]) if p["new_document"]]

    old = packer(0, 1)
    seen = documents(list(itertools.islice(old, 7)))
    state = old.state_dict()
    new = [packer(r, 2) for r in range(2)]
    for stream in new:
        stream.load_shard_states([state])
    # the pass in progress: each new shard reads its share until it has packed pass-1 documents of both sources
    for stream in new:
        later = set()
        for pack in itertools.islice(stream, 200):
            for document, piece in zip(documents([pack]), [p for p in pack["provenance"] if p["new_document"]]):
                if piece["epoch"] == 0:
                    seen.append(document)
                else:
                    later.add(piece["source"])
            if later == {"a", "b"}:
                break
        held = stream.state_dict()[stream.dataset_name]["packs"]  # documents still waiting in open packs
        for source, row, epoch, new in zip(held["source"], held["row"], held["epoch"], held["new_document"]):
            name = held["sources"][source]
            if epoch == 0 and new:
                seen.append((name, {"a": 1000, "b": 5000}[name] + row))
    first_tokens = sorted(seen)
    assert len(first_tokens) == len(set(first_tokens)), "a document was packed twice"
    assert {t for s, t in first_tokens if s == "a"} == set(range(1000, 1060))
    assert {t for s, t in first_tokens if s == "b"} == set(range(5000, 5060))


def test_loading_a_state_with_other_packing_settings_is_a_clear_error():
    state = IterablePackedDataset(_make_finite(), 48, strategy="greedy").state_dict()
    with pytest.raises(ValueError, match="strategy='greedy', max_seq_len=48.*strategy='concat'"):
        IterablePackedDataset(_make_finite(), 48, strategy="concat").load_state_dict(state)


def assert_taking_packs_equals_one_at_a_time(make, count: int) -> None:
    """``take(count)`` hands out the packs, counters and state of ``count`` calls of ``next``, through
    the end of a finite child, and a new ``iter()`` starts the same new round."""
    one, many = make(), make()
    for round_number in range(2):  # a finite child's round, then the next one (which may be empty)
        singles, batches = iter(one), iter(many)
        takes = 0
        while True:
            got = batches.take(count)
            want = list(itertools.islice(singles, count))
            _assert_same_packs([dict(pack) for pack in got], [dict(pack) for pack in want])
            assert many.state_dict() == one.state_dict() and many.counters == one.counters
            if snapshot := getattr(many, "snapshot", None):
                assert snapshot()() == one.state_dict()
            takes += 1
            if len(got) < count:
                break
        assert takes > 3 or round_number
        assert batches.take(count) == [] and next(singles, None) is None
        assert many.state_dict() == one.state_dict()
        assert next(iter(many.state_dict().values()))["finished"]  # the round is over: iter() starts a new one


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("count", [1, 3, 8])
@pytest.mark.parametrize("source", ["interleaved", "finite"])
def test_taking_packs_in_batches_hands_out_the_packs_and_state_of_one_at_a_time(strategy, count, source):
    def make() -> IterablePackedDataset:
        child = _make_interleaved() if source == "interleaved" else _make_finite()
        return IterablePackedDataset(child, 48, strategy=strategy, buffer_size=8)

    if source == "interleaved":  # an endless child: compare a stretch of it
        one, many = make(), make()
        singles, batches = iter(one), iter(many)
        for _ in range(12):
            _assert_same_packs([dict(p) for p in batches.take(count)],
                               [dict(p) for p in itertools.islice(singles, count)])
            assert many.state_dict() == one.state_dict()
        return
    assert_taking_packs_equals_one_at_a_time(make, count)


def test_a_finished_packer_starts_a_new_round_when_iterated_again():
    packer = IterablePackedDataset(_make_finite(), 48, strategy="best_fit")
    first = list(packer)
    _assert_same_packs(list(packer), first)


# ---------------------------------------------------------------- workers and validation


def test_packing_runs_per_dataloader_worker_on_disjoint_shards():
    docs = _random_docs(64, 9, max_len=20)
    stream = InMemoryStream(docs, "d", seed=0, num_passes=1)
    loader = DataLoader(IterablePackedDataset(stream, 32, strategy="greedy"), batch_size=None, num_workers=2)
    packs = list(loader)
    assert sorted(map(tuple, _flat_docs(packs))) == sorted(tuple(d.tolist()) for d in docs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"strategy": "first_fit"}, "Unknown packing strategy 'first_fit'"),
        ({"overlong": "split"}, "Unknown overlong policy 'split'"),
        ({"max_seq_len": 0}, "max_seq_len must be a positive int"),
        ({"buffer_size": 0}, "buffer_size must be a positive int"),
    ],
)
def test_invalid_settings_are_rejected(kwargs, message):
    args = {"max_seq_len": 16, **kwargs}
    with pytest.raises(ValueError, match=message):
        IterablePackedDataset(_make_finite(), **args)


def test_default_name_is_packed_child_name():
    assert IterablePackedDataset(_make_finite(), 16).dataset_name == "packed_f"
    assert IterablePackedDataset(_make_finite(), 16, dataset_name="p").dataset_name == "p"


def test_a_stream_of_only_empty_documents_is_an_error_not_a_hang():
    import lightning_tune_data.packing.intake as intake_module

    class Empties(InMemoryStream):
        def __iter__(self):
            while True:
                yield {"input_ids": np.zeros(0, dtype=np.int64), "source": "blank", "epoch": 0}

    packer = IterablePackedDataset(Empties([[1]], "blank"), 16, strategy="best_fit")
    original = intake_module._MAX_UNUSABLE_IN_A_ROW
    intake_module._MAX_UNUSABLE_IN_A_ROW = 50
    try:
        with pytest.raises(RuntimeError, match=r"last 50 documents of 'blank'.*empty"):
            next(iter(packer))
    finally:
        intake_module._MAX_UNUSABLE_IN_A_ROW = original
