"""A mixture read in blocks draws exactly what one-document iteration draws, and saves the same state."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from lightning_tune_data.mixing.blocks import MixedReader
from lightning_tune_data.mixing.interleave import InterleavedDataset
from lightning_tune_data.mixing.schedule import DrawSchedule
from lightning_tune_data.packing.packer import IterablePackedDataset
from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.arrow import ArrowSource


def _table(num_rows: int, seed: int) -> pa.Table:
    """Documents of 0..90 tokens: some empty, some longer than the sources' max_seq_len of 64."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 90, size=num_rows)
    docs = [rng.integers(0, 1000, size=n).astype(np.int32) for n in lengths]
    return pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int32()))})


TABLES = {"web": _table(300, 0), "code": _table(120, 1), "books": _table(40, 2)}


class _DocumentsOnly(ArrowSource):
    """The same source, read one document at a time (block reading switched off)."""

    def blocks_supported(self) -> bool:
        return False


def _mixture(mix_by: str, overlong: str, blocks: bool = True) -> InterleavedDataset:
    source = ArrowSource if blocks else _DocumentsOnly
    children = [source(table, name, seed=5, max_seq_len=64, overlong=overlong) for name, table in TABLES.items()]
    return InterleavedDataset(children, [0.5, 0.3, 0.2], seed=9, mix_by=mix_by)


@pytest.mark.parametrize("mix_by", ["documents", "tokens"])
@pytest.mark.parametrize("overlong", ["truncate", "drop"])
def test_blocks_draw_the_documents_iteration_draws_with_the_same_state_after_each(mix_by: str, overlong: str) -> None:
    by_block, by_document = _mixture(mix_by, overlong), _mixture(mix_by, overlong)
    assert by_block.blocks_supported()
    documents = iter(by_document)
    for limit in (1, 7, 200, 513, 64, 700):  # blocks of the mixture shorter and longer than the children's
        block = by_block.read_block(limit)
        assert len(block.refs) == limit
        for k in range(limit):
            sample = next(documents)
            ref = block.refs[k]
            assert (ref[0], ref[1], ref[2], ref[4]) == (sample["source"], sample["source_row"], sample["epoch"],
                                                        len(sample["input_ids"]))
            np.testing.assert_array_equal(block.input_ids[k], sample["input_ids"])
            if k % 9 == 0 or k == limit - 1:
                assert by_block.state_after_block(block, k + 1) == by_document.state_dict()
    # the smallest source went round several passes
    assert by_document.state_dict()["interleaved"]["children"]["books"]["walk"]["plan"]["epoch"] >= 2


def test_a_mixture_with_a_finite_child_or_stopping_strategy_is_read_one_document_at_a_time() -> None:
    finite = [ArrowSource(TABLES["web"], "web", num_passes=1), ArrowSource(TABLES["code"], "code")]
    assert not InterleavedDataset(finite, [1, 1], seed=0).blocks_supported()
    children = [ArrowSource(TABLES["web"], "web"), ArrowSource(TABLES["code"], "code")]
    assert not InterleavedDataset(children, [1, 1], seed=0, stopping_strategy="all_exhausted").blocks_supported()
    assert InterleavedDataset(children, [1, 1], seed=0).blocks_supported()


def _packs(stream, count: int) -> tuple[list[dict], list[dict]]:
    packs, states, it = [], [], iter(stream)
    for _ in range(count):
        packs.append(dict(next(it)))
        states.append(json.loads(json.dumps(stream.state_dict())))
    return packs, states


def _assert_same(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        for key in ("input_ids", "labels", "position_ids", "document_ids"):
            np.testing.assert_array_equal(a[key], b[key])
        assert a["seq_lens"] == b["seq_lens"] and a["provenance"] == b["provenance"]


@pytest.mark.parametrize("strategy", ["greedy", "best_fit", "concat"])
def test_packed_mixture_read_in_blocks_packs_and_resumes_exactly_like_one_document_at_a_time(strategy: str) -> None:
    def packer(blocks: bool) -> IterablePackedDataset:
        return IterablePackedDataset(_mixture("tokens", "truncate", blocks), 64, strategy=strategy, buffer_size=4)

    fast, slow = packer(True), packer(False)
    assert fast._reads_blocks() and not slow._reads_blocks()
    fast_packs, fast_states = _packs(fast, 120)
    slow_packs, slow_states = _packs(slow, 120)
    _assert_same(fast_packs, slow_packs)
    assert fast_states == slow_states  # positions and accounts, never documents of a block
    for stop in (0, 13, 77):
        resumed = packer(True)
        resumed.load_state_dict(fast_states[stop])
        _assert_same(_packs(resumed, 120 - stop - 1)[0], fast_packs[stop + 1 :])


def test_a_nested_mixture_reads_blocks_and_draws_what_iteration_draws() -> None:
    def nested(blocks: bool) -> InterleavedDataset:
        source = ArrowSource if blocks else _DocumentsOnly
        inner = InterleavedDataset([source(TABLES["code"], "code", seed=1), source(TABLES["books"], "books", seed=1)],
                                   [0.7, 0.3], seed=2, dataset_name="inner", mix_by="tokens")
        return InterleavedDataset([source(TABLES["web"], "web", seed=1), inner], [0.6, 0.4], seed=3)

    by_block, by_document = nested(True), nested(False)
    assert by_block.blocks_supported() and not by_document.blocks_supported()
    documents = iter(by_document)
    for limit in (300, 900):
        block = by_block.read_block(limit)
        for k in range(limit):
            sample = next(documents)
            assert block.refs[k][:3] == (sample["source"], sample["source_row"], sample["epoch"])
            if k % 50 == 0:
                assert by_block.state_after_block(block, k + 1) == by_document.state_dict()


def test_a_reader_advances_the_schedule_it_is_given_and_builds_states_through_its_callback() -> None:
    children = [ArrowSource(table, name, seed=5, max_seq_len=64) for name, table in TABLES.items()]
    schedule = DrawSchedule("interleaved", list(TABLES), [0.5, 0.3, 0.2], "tokens", StreamSettings(seed=9))
    reader = MixedReader("interleaved", children, schedule,
                         lambda draws, accounts, states: {"draws": draws, "accounts": accounts, "children": states})
    block = reader.read(150)
    assert block.refs == _mixture("tokens", "truncate").read_block(150).refs
    assert schedule.draws == 150
    assert schedule.consumed == [list(block.accounts[max(k for k, c in enumerate(block.chosen) if c == i)])
                                 for i in range(3)]
    assert schedule.total_tokens == sum(ref[4] for ref in block.refs)
    state = reader.state_after(block, 40)
    assert state["draws"] == 40 and set(state["children"]) == set(TABLES)
    assert sum(account[0] for account in state["accounts"]) == 40


def test_state_after_a_block_the_mixture_did_not_read_is_refused() -> None:
    block = _mixture("documents", "truncate").read_block(3)
    with pytest.raises(ValueError, match="this block was not read by this mixture"):
        _mixture("documents", "truncate").state_after_block(block, 1)
