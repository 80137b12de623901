"""Packing strategies: the registry, each built-in strategy's placement, and adding a strategy."""

from __future__ import annotations

import itertools
import typing

import numpy as np
import pytest

from lightning_tune_data.packing import (
    IterablePackedDataset,
    PackingName,
    PackingStrategy,
    get_strategy,
    register_strategy,
    strategy_names,
)
from lightning_tune_data.packing.document_queue import DocumentQueue
from lightning_tune_data.packing.pack import Pack
from lightning_tune_data.packing.pieces import LENGTH_AT, PieceExtra, PieceTokens, Reference, reference
from lightning_tune_data.packing.placement import PackPlacer
from lightning_tune_data.packing.strategies import base as strategies_base
from lightning_tune_data.packing.strategies import BestFit, Concat, Greedy
from lightning_tune_data.packing.strategies.best_fit import free_key
from lightning_tune_data.sources.arrow import ArrowSource
from lightning_tune_data.sources.memory import InMemoryStream
from packing_helpers import (
    STRATEGIES,
    DocumentsOnly,
    assert_same_packs,
    flat_docs,
    lognormal_lengths,
    make_interleaved,
    random_docs,
    roundtrip,
    token_table,
)


@pytest.fixture
def isolated_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Strategies registered by a test are gone after it."""
    monkeypatch.setattr(strategies_base, "_REGISTRY", dict(strategies_base._REGISTRY))


# ---------------------------------------------------------------- the registry


def test_the_built_in_strategies_are_registered_in_order_and_named_by_the_literal():
    assert strategy_names() == ("greedy", "best_fit", "concat")
    assert typing.get_args(PackingName) == strategy_names()
    assert (get_strategy("greedy"), get_strategy("best_fit"), get_strategy("concat")) == (Greedy, BestFit, Concat)


def test_only_concat_splits_documents():
    assert [get_strategy(name).splits_documents for name in STRATEGIES] == [False, False, True]


@pytest.mark.parametrize("name", ["first_fit", "", None, "Greedy"])
def test_an_unknown_name_is_an_error_that_lists_the_registered_names(name):
    with pytest.raises(ValueError, match=r"Unknown packing strategy .*choose one of \['greedy', 'best_fit', 'concat'\]"):
        get_strategy(name)


def test_a_name_registered_twice_is_an_error(isolated_registry):
    class OtherGreedy(Greedy):
        name = "greedy"

    with pytest.raises(ValueError, match="named 'greedy' is registered already"):
        register_strategy(OtherGreedy)
    assert register_strategy(Greedy) is Greedy  # registering the same class again changes nothing
    assert get_strategy("greedy") is Greedy


def test_only_named_strategy_classes_can_be_registered(isolated_registry):
    class Nameless(Greedy):
        name = ""

    with pytest.raises(ValueError, match="needs a non-empty string `name`"):
        register_strategy(Nameless)
    with pytest.raises(TypeError, match="PackingStrategy subclass"):
        register_strategy(dict)
    assert strategy_names() == ("greedy", "best_fit", "concat")


# ---------------------------------------------------------------- adding a strategy


class FirstFit(PackingStrategy):
    """The oldest open pack that holds the document; the oldest pack is finished beyond ``buffer_size``."""

    name = "first_fit"

    def add(self, ref: Reference, tokens: PieceTokens, extra: PieceExtra | None) -> None:
        for number, pack in self.open.items():
            if pack.length + ref[LENGTH_AT] <= self.max_seq_len:
                break
        else:
            pack = Pack(self.stores)
            number = self.open_pack(pack)
            if len(self.open) > self.placer.buffer_size:
                self.ready.append(self.open.pop(next(iter(self.open))))
        pack.add(ref, tokens, extra)
        if pack.length == self.max_seq_len:
            self.ready.append(self.open.pop(number))


def test_a_registered_strategy_packs_by_name(isolated_registry):
    assert register_strategy(FirstFit) is FirstFit
    assert strategy_names()[-1] == "first_fit" and not get_strategy("first_fit").splits_documents
    docs = [np.full(n, i) for i, n in enumerate([4, 6, 2, 12])]

    def packs(strategy: str) -> list:
        stream = InMemoryStream(docs, "d", shuffle=False, num_passes=1)
        return list(IterablePackedDataset(stream, 8, strategy=strategy, buffer_size=4))

    # 4 -> A; 6 -> B; 2 -> A, the oldest that holds it (best_fit takes B, the tightest); 12 is cut
    # to 8 by the overlong policy and fills a pack of its own; the open packs flush oldest first.
    assert [p["seq_lens"] for p in packs("first_fit")] == [[8], [4, 2], [6]]
    assert [p["seq_lens"] for p in packs("best_fit")] == [[6, 2], [8], [4]]


@pytest.mark.parametrize("stop_after", [0, 5, 17])
def test_a_registered_strategy_resumes_exactly(isolated_registry, stop_after):
    register_strategy(FirstFit)

    def make() -> IterablePackedDataset:
        return IterablePackedDataset(make_interleaved(), 48, strategy="first_fit", buffer_size=3)

    reference_packs = list(itertools.islice(make(), 40))
    packer = make()
    head = list(itertools.islice(packer, stop_after))
    state = roundtrip(packer.state_dict())
    assert state["packed_interleaved"]["strategy"] == "first_fit"
    resumed = make()
    resumed.load_state_dict(state)
    assert_same_packs(head + list(itertools.islice(resumed, 40 - stop_after)), reference_packs)


def test_a_registered_strategy_packs_blocks_as_it_packs_documents(isolated_registry):
    register_strategy(FirstFit)
    table = token_table(300, seed=3)
    fast = IterablePackedDataset(ArrowSource(table, "s", seed=1), 64, strategy="first_fit", buffer_size=4)
    slow = IterablePackedDataset(DocumentsOnly(table, "s", seed=1), 64, strategy="first_fit", buffer_size=4)
    assert fast._reads_blocks() and not slow._reads_blocks()
    assert_same_packs([dict(p) for p in itertools.islice(fast, 200)], [dict(p) for p in itertools.islice(slow, 200)])
    assert fast.counters == slow.counters and fast.counters["overlong_truncated"] > 0


# ---------------------------------------------------------------- a strategy's loops


def _queue(lengths: list[int]) -> DocumentQueue:
    refs = [reference("s", row, 0, n) for row, n in enumerate(lengths)]
    return DocumentQueue(refs, [np.arange(n) + 1000 * row for row, n in enumerate(lengths)])


def _placed(placer: PackPlacer) -> list[list[tuple]]:
    return [list(pack.refs) for pack in placer.ready]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("until_ready", [1, 3, 1000])
def test_the_block_loop_places_what_one_document_at_a_time_places(strategy, until_ready):
    lengths = [int(n) for n in np.random.default_rng(5).integers(1, 120, size=400)]  # some longer than 64
    block_counters, each_counters = {"overlong_truncated": 0, "overlong_dropped": 0}, {"overlong_truncated": 0,
                                                                                       "overlong_dropped": 0}
    by_block = PackPlacer(strategy, 64, 4, "truncate", block_counters)
    by_each = PackPlacer(strategy, 64, 4, "truncate", each_counters)
    block_queue, each_queue = _queue(lengths), _queue(lengths)
    while block_queue or each_queue:
        placed = by_block.strategy.place_block(block_queue, until_ready)
        assert by_each.strategy.place_each(each_queue, until_ready) == placed
        assert block_queue.at == each_queue.at
        assert _placed(by_block) == _placed(by_each)
        assert [pack.refs for pack in by_block.strategy.open.values()] == [
            pack.refs for pack in by_each.strategy.open.values()]
        if block_queue:  # stopped with the packs asked for, at the document that finished the last one
            assert len(by_block.ready) >= until_ready
        by_block.ready.clear()
        by_each.ready.clear()
    assert block_counters == each_counters


def test_best_fit_rebuilds_its_free_space_index_from_restored_open_packs():
    counters = {"overlong_truncated": 0, "overlong_dropped": 0}
    original = PackPlacer("best_fit", 16, 8, "truncate", counters)
    queue = _queue([5, 9, 3, 12, 7, 2, 6, 10, 4, 1, 8])
    original.place_from(queue, until_ready=2)
    restored = PackPlacer("best_fit", 16, 8, "truncate", dict(counters))
    restored.set_open([pack.prefix(len(pack.refs)) for pack in original.strategy.open.values()])
    open_packs = restored.strategy.open
    assert len(open_packs) == len(original.strategy.open) > 1
    assert restored.strategy.free == sorted(free_key(16 - pack.length, number) for number, pack in open_packs.items())
    rest = _queue([3, 6, 11, 2, 5, 9])
    original.ready.clear()
    original.place_from(rest, until_ready=100)
    restored.place_from(_queue([3, 6, 11, 2, 5, 9]), until_ready=100)
    assert _placed(restored) == _placed(original)


# ---------------------------------------------------------------- each strategy's placement


def test_greedy_is_next_fit_and_keeps_document_order():
    docs = [np.full(n, i) for i, n in enumerate([3, 4, 2, 5, 1, 6])]
    stream = InMemoryStream(docs, "d", shuffle=False, num_passes=1)
    packs = list(IterablePackedDataset(stream, 8, strategy="greedy"))
    assert [p["seq_lens"] for p in packs] == [[3, 4], [2, 5, 1], [6]]
    assert flat_docs(packs) == [d.tolist() for d in docs]


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
    docs = random_docs(300, 4, max_len=64)
    stream = InMemoryStream(docs, "d", seed=1, num_passes=1)
    packs = list(IterablePackedDataset(stream, 64, strategy=strategy))
    assert sorted(map(tuple, flat_docs(packs))) == sorted(tuple(d.tolist()) for d in docs)
    assert all(p["new_document"] for pack in packs for p in pack["provenance"])


def test_concat_cuts_full_blocks_carrying_leftovers_without_dropping_tokens():
    docs = random_docs(120, 5, max_len=90)
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
    lengths = lognormal_lengths(20_000)
    assert 280 <= lengths.mean() <= 320
    docs = [np.ones(n, dtype=np.int64) for n in lengths]
    stream = InMemoryStream(docs, "lognormal", seed=0, num_passes=1)
    packer = IterablePackedDataset(stream, 2048, strategy="best_fit")
    packs = list(packer)
    efficiency = sum(len(p["input_ids"]) for p in packs) / (len(packs) * 2048)
    assert efficiency >= 0.99, efficiency
    assert packer.counters["overlong_truncated"] == int((lengths > 2048).sum())


