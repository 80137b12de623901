"""IterablePackedDataset: packed-sample format, labels, overlong policy, settings, exact resume."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from torch.utils.data import DataLoader

from lightning_tune_data.mixing.interleave import InterleavedDataset
from lightning_tune_data.packing import PACKING_STRATEGIES, IterablePackedDataset, strategy_names
from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.memory import InMemoryStream
from packing_helpers import (
    ARRAY_KEYS,
    STRATEGIES,
    assert_same_packs,
    flat_docs,
    make_finite,
    make_interleaved,
    random_docs,
    roundtrip,
)


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
    stream = InMemoryStream(random_docs(200, 1), "src", seed=0, num_passes=1)
    packs = list(IterablePackedDataset(stream, 64, strategy=strategy))
    assert packs
    for pack in packs:
        _check_pack_invariants(pack, 64)
        assert {p["source"] for p in pack["provenance"]} == {"src"}


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_label_is_the_next_target_token_of_the_same_document_or_ignored(strategy):
    docs = random_docs(150, 2, max_len=50, with_mask=True)
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


# ---------------------------------------------------------------- overlong and empty documents


@pytest.mark.parametrize("strategy", ["greedy", "best_fit"])
def test_overlong_documents_are_truncated_or_dropped_and_counted(strategy):
    docs = [np.arange(5), np.arange(100, 120), np.arange(200, 203), np.arange(300, 311)]
    truncating = IterablePackedDataset(InMemoryStream(docs, "d", shuffle=False, num_passes=1), 10,
                                       strategy=strategy, overlong="truncate")
    kept = flat_docs(list(truncating))
    assert sorted(kept) == sorted([list(range(5)), list(range(100, 110)), [200, 201, 202],
                                   list(range(300, 310))])
    assert truncating.counters["overlong_truncated"] == 2
    assert truncating.counters["overlong_dropped"] == 0

    dropping = IterablePackedDataset(InMemoryStream(docs, "d", shuffle=False, num_passes=1), 10,
                                     strategy=strategy, overlong="drop")
    assert sorted(flat_docs(list(dropping))) == sorted([list(range(5)), [200, 201, 202]])
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
    assert flat_docs(list(packer)) == [[1, 2], [3]]
    assert packer.counters["empty_dropped"] == 1
    from_sources = IterablePackedDataset(InMemoryStream([[1, 2], [], [3]], "d", shuffle=False, num_passes=1), 8,
                                         strategy=strategy)
    assert flat_docs(list(from_sources)) == [[1, 2], [3]]  # sources skip empty documents themselves


# ---------------------------------------------------------------- exact resume


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("source", ["interleaved", "finite"])
@pytest.mark.parametrize("stop_after", [0, 1, 7, 23, 50, -3, -1])
def test_resume_after_k_packs_continues_with_exactly_the_same_packs(strategy, source, stop_after):
    """``stop_after < 0`` counts from the end (the finite source then stops inside the final flush)."""
    def make() -> IterablePackedDataset:
        child = make_interleaved() if source == "interleaved" else make_finite()
        return IterablePackedDataset(child, 48, strategy=strategy, buffer_size=8)

    total = 80
    reference = list(itertools.islice(make(), total))
    stop_after = min(stop_after, len(reference))  # the finite source packs into fewer than 80
    if stop_after < 0:
        stop_after += len(reference)
    packer = make()
    it = iter(packer)
    head = [next(it) for _ in range(stop_after)]
    state = roundtrip(packer.state_dict())
    next(it, None)  # the original moves on; the saved state must be unaffected
    resumed = make()
    resumed.load_state_dict(state)
    tail = list(itertools.islice(resumed, total - stop_after))
    assert_same_packs(head + tail, reference)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_state_holds_buffered_documents_by_reference_never_tokens(strategy):
    packer = IterablePackedDataset(make_interleaved(), 48, strategy=strategy, buffer_size=8)
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
    small, large = (IterablePackedDataset(make_interleaved(), n, strategy=strategy, buffer_size=8) for n in (48, 4800))
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
    state = IterablePackedDataset(make_finite(), 48, strategy="greedy").state_dict()
    with pytest.raises(ValueError, match="strategy='greedy', max_seq_len=48.*strategy='concat'"):
        IterablePackedDataset(make_finite(), 48, strategy="concat").load_state_dict(state)


# ---------------------------------------------------------------- workers and validation


def test_packing_runs_per_dataloader_worker_on_disjoint_shards():
    docs = random_docs(64, 9, max_len=20)
    stream = InMemoryStream(docs, "d", seed=0, num_passes=1)
    loader = DataLoader(IterablePackedDataset(stream, 32, strategy="greedy"), batch_size=None, num_workers=2)
    packs = list(loader)
    assert sorted(map(tuple, flat_docs(packs))) == sorted(tuple(d.tolist()) for d in docs)


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
        IterablePackedDataset(make_finite(), **args)


def test_default_name_is_packed_child_name():
    assert IterablePackedDataset(make_finite(), 16).dataset_name == "packed_f"
    assert IterablePackedDataset(make_finite(), 16, dataset_name="p").dataset_name == "p"




def test_packing_strategies_are_the_registered_names_in_order():
    assert PACKING_STRATEGIES == strategy_names() == ("greedy", "best_fit", "concat")


# ---------------------------------------------------------------- run settings


def test_settings_supply_max_seq_len_and_overlong():
    docs = [np.arange(5), np.arange(100, 120), np.arange(200, 203)]

    def stream() -> InMemoryStream:
        return InMemoryStream(docs, "d", shuffle=False, num_passes=1)

    from_settings = IterablePackedDataset(stream(), strategy="greedy",
                                          settings=StreamSettings(max_seq_len=10, overlong="drop"))
    from_arguments = IterablePackedDataset(stream(), 10, strategy="greedy", overlong="drop")
    assert from_settings.max_seq_len == 10
    assert_same_packs(list(from_settings), list(from_arguments))
    assert from_settings.counters == from_arguments.counters
    assert from_settings.counters["overlong_dropped"] == 1


def test_settings_without_a_length_limit_leave_max_seq_len_to_the_argument():
    settings = StreamSettings(max_seq_len=None)  # what the sources of a strategy that splits documents get
    packer = IterablePackedDataset(make_finite(), 48, strategy="concat", settings=settings)
    assert packer.max_seq_len == 48
    assert_same_packs(list(packer), list(IterablePackedDataset(make_finite(), 48, strategy="concat")))


def test_arguments_that_agree_with_the_settings_are_accepted():
    settings = StreamSettings(max_seq_len=16, overlong="drop")
    packer = IterablePackedDataset(make_finite(), 16, overlong="drop", settings=settings)
    assert packer.max_seq_len == 16


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_seq_len": 32}, "max_seq_len=32 contradicts settings.max_seq_len=16"),
        ({"overlong": "truncate"}, "overlong='truncate' contradicts settings.overlong='drop'"),
    ],
)
def test_arguments_that_contradict_the_settings_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        IterablePackedDataset(make_finite(), settings=StreamSettings(max_seq_len=16, overlong="drop"), **kwargs)


def test_max_seq_len_is_required_without_settings():
    with pytest.raises(ValueError, match="max_seq_len must be a positive int, got None"):
        IterablePackedDataset(make_finite())
    with pytest.raises(ValueError, match="max_seq_len must be a positive int, got None"):
        IterablePackedDataset(make_finite(), settings=StreamSettings())
