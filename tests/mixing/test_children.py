"""ChildStreams: a mixture's children, the stopping strategies, the round's flags and the children's states."""

from __future__ import annotations

import collections
import itertools
import logging

import pyarrow as pa
import pytest

from lightning_tune_data.mixing.children import ChildStreams, unique_names
from lightning_tune_data.mixing.interleave import InterleavedDataset
from lightning_tune_data.sources.arrow import ArrowSource
from lightning_tune_data.sources.base import ElasticResumeUnsupported
from lightning_tune_data.sources.memory import InMemoryStream
from mixtures import key as _key
from mixtures import stream as _stream

CHILDREN_LOGGER = "lightning_tune_data.mixing.children"


def _children(strategy: str, lengths: dict[str, int], num_passes: int | None = 1) -> ChildStreams:
    datasets = [_stream(n, k, shuffle=False, num_passes=num_passes) for n, k in lengths.items()]
    return ChildStreams("mix", datasets, unique_names("mix", datasets), strategy)


# ---------------------------------------------------------------- names


def test_duplicate_child_names_are_rejected_listing_the_duplicates():
    with pytest.raises(ValueError, match=r"duplicate child dataset names \['a'\]"):
        InterleavedDataset([_stream("a", 4), _stream("b", 4), _stream("a", 5)], [1, 1, 1], seed=0)


def test_unique_names_keeps_the_order_of_the_children():
    assert unique_names("mix", [_stream("c", 2), _stream("a", 2), _stream("b", 2)]) == ["c", "a", "b"]


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
    with caplog.at_level(logging.WARNING, logger=CHILDREN_LOGGER):
        out = list(itertools.islice(ds, 60))
    assert sum(s["source"] == "a" for s in out) > 3
    assert "child 'a' ended" in caplog.text


def test_a_finished_finite_mixture_replays_from_the_start_when_iterated_again():
    ds = InterleavedDataset(_finite({"a": 5, "b": 7}), [0.5, 0.5], seed=9, stopping_strategy="all_exhausted")
    assert [_key(s) for s in ds] == [_key(s) for s in ds]


def test_an_ended_child_under_first_exhausted_finishes_the_round():
    children = _children("first_exhausted", {"a": 2, "b": 3})
    iterators = children.open()
    assert children.after_end(1, iterators, set()) is None
    assert children.exhausted == [False, True] and children.finished
    assert children.active() == [0]


def test_an_ended_child_under_all_exhausted_leaves_the_round_which_goes_on():
    children = _children("all_exhausted", {"a": 2, "b": 3})
    iterators = children.open()
    assert children.after_end(0, iterators, set()) is None
    assert iterators[0] is None and iterators[1] is not None
    assert children.exhausted == [True, False] and not children.finished
    assert children.active() == [1]
    assert children.open()[0] is None  # an exhausted child is not reopened within the round
    children.reset()
    assert children.exhausted == [False, False] and all(it is not None for it in children.open())


def test_an_ended_child_under_infinite_restarts_warning_once_per_child(caplog):
    children = _children("infinite", {"a": 2, "b": 3})
    iterators, warned = children.open(), set()
    assert [_key(s) for s in iterators[0]] == [("a", 0, (0, 0)), ("a", 0, (1, 1))]  # child 'a' ends
    with caplog.at_level(logging.WARNING, logger=CHILDREN_LOGGER):
        first = children.after_end(0, iterators, warned)
        # the restarted child (a finished finite one starts over) goes on in the replaced iterator
        assert [_key(s) for s in [first, *iterators[0]]] == [("a", 0, (0, 0)), ("a", 0, (1, 1))]
        again = children.after_end(0, iterators, warned)
    assert _key(again) == ("a", 0, (0, 0))
    assert warned == {0} and caplog.text.count("child 'a' ended") == 1
    assert children.exhausted == [False, False] and not children.finished


def test_a_child_that_yields_nothing_even_after_a_restart_is_an_error():
    class Empty(InMemoryStream):
        def __iter__(self):
            return iter(())

    datasets = [Empty([[1]], "a"), _stream("b", 3)]
    children = ChildStreams("mix", datasets, ["a", "b"], "infinite")
    with pytest.raises(RuntimeError, match="child 'a' yields nothing even after a restart"):
        children.after_end(0, children.open(), set())


# ---------------------------------------------------------------- state


def test_loading_a_state_without_a_child_names_the_missing_child():
    saved = InterleavedDataset([_stream("a", 4), _stream("b", 4)], [1, 1], seed=0).state_dict()
    other = InterleavedDataset([_stream("a", 4), _stream("c", 4)], [1, 1], seed=0)
    with pytest.raises(KeyError, match=r"children \['c'\]"):
        other.load_state_dict(saved)


def test_flags_round_trip_through_the_state_by_name():
    ds = InterleavedDataset(_finite({"a": 3, "b": 9}), [0.5, 0.5], seed=2, stopping_strategy="all_exhausted")
    list(itertools.islice(ds, 7))
    own = ds.state_dict()["interleaved"]
    assert own["exhausted"] == {"a": True, "b": False} and own["finished"] is False
    children = ChildStreams("interleaved", _finite({"a": 3, "b": 9}), ["a", "b"], "all_exhausted")
    children.load(own)
    assert children.exhausted == [True, False] and not children.finished
    assert children.flags_state(children.exhausted) == own["exhausted"]
    assert children.flags_state(None) == {"a": False, "b": False}


def test_a_finite_mixture_refuses_to_resume_with_another_layout():
    for strategy in ("first_exhausted", "all_exhausted"):
        old = [InterleavedDataset(_finite({"a": 5, "b": 5}), [0.5, 0.5], seed=0, stopping_strategy=strategy)
               for _ in range(2)]
        with pytest.raises(ElasticResumeUnsupported, match="resume_data_state: false"):
            old[0].merge_shard_states([ds.state_dict() for ds in old])
    _children("infinite", {"a": 2}).check_elastic()  # an infinite round can


def test_children_merge_their_shard_states_by_name_and_every_document_is_read_once_after():
    old = [InterleavedDataset([_stream("a", 40, rank=r, world_size=2), _stream("b", 40, rank=r, world_size=2)],
                              [0.5, 0.5], seed=1, rank=r, world_size=2) for r in range(2)]
    seen = collections.Counter()
    for ds, count in zip(old, (9, 14)):
        seen.update(_key(s) for s in itertools.islice(ds, count))
    merged = old[0].merge_shard_states([ds.state_dict() for ds in old])
    assert set(merged["interleaved"]["children"]) == {"a", "b"}
    new = InterleavedDataset([_stream("a", 40), _stream("b", 40)], [0.5, 0.5], seed=1)
    new.load_global_state(merged)
    rest = [_key(s) for s in itertools.islice(new, 160)]
    first_pass = [key for key in list(seen) + rest if key[1] == 0]
    assert len(first_pass) == len(set(first_pass)) == 80  # no document of the first pass twice or lost


def test_read_document_asks_each_child_and_blocks_need_infinite_block_readers():
    children = _children("infinite", {"a": 4, "b": 4}, num_passes=None)
    assert children.read_document("b", 2, 1)["input_ids"].tolist() == [10_002, 10_002]
    assert children.read_document("c", 0, 0) is None
    assert not children.blocks_supported()  # in-memory streams hand out documents, not blocks
    table = pa.table({"input_ids": pa.array([[1, 2], [3]], type=pa.list_(pa.int32()))})
    readers = [ArrowSource(table, "a"), ArrowSource(table, "b")]
    assert ChildStreams("mix", readers, ["a", "b"], "infinite").blocks_supported()
    assert not ChildStreams("mix", readers, ["a", "b"], "all_exhausted").blocks_supported()
