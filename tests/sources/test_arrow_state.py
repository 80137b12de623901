"""ArrowSourceState: a shard's walk and counters, O(1) state, snapshots, the state after part of a block,
merging and splitting across layouts."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.arrow import ArrowSource
from lightning_tune_data.sources.arrow_state import ArrowSourceState
from lightning_tune_data.sources.source_state import SourceCounters

from source_tables import described, gappy_table, table, take


def state_of(num_rows: int = 20, **settings) -> ArrowSourceState:
    return ArrowSourceState("src", num_rows, StreamSettings(**settings), SourceCounters())


def test_a_fresh_state_is_pass_0_of_this_shard_with_nothing_counted():
    state = state_of(21, rank=1, world_size=2)
    walk = state.walk()
    assert (walk.epoch, walk.num_shards, walk.shard_id, walk.plan.taken) == (0, 2, 1, 0)
    saved = state.state_dict()["src"]
    assert saved["walk"]["num_rows"] == 21 and saved["walk"]["plan"]["tail_taken"] == 0
    assert saved["counters"] == SourceCounters().state_dict()


def test_a_loaded_state_restores_the_walk_and_the_counters_in_place():
    written = state_of()
    written.walk().plan.advance(7)
    written.counters.empty_skipped = 2
    counters = SourceCounters()
    loaded = ArrowSourceState("src", 20, StreamSettings(), counters)
    loaded.load_state_dict(json.loads(json.dumps(written.state_dict()["src"])))
    assert loaded.state_dict() == written.state_dict()
    assert counters.empty_skipped == 2  # the object the other parts count into


def test_a_state_written_over_another_number_of_rows_is_refused_naming_the_way_out():
    saved = state_of(20).state_dict()["src"]
    with pytest.raises(ValueError, match="written for 20 rows but the cache now has 21.*resume_data_state: false"):
        state_of(21).load_state_dict(saved)
    with pytest.raises(ValueError, match="written for 20 rows"):
        state_of(21).merge([saved])


def test_merged_states_are_split_on_first_use_and_the_first_shard_keeps_the_counter_totals():
    old = [state_of(40, rank=rank, world_size=2) for rank in range(2)]
    for state, (read, empty) in zip(old, [(5, 1), (9, 2)]):
        state.walk().plan.advance(read)
        state.counters.empty_skipped = empty
    merged = old[0].merge([state.state_dict()["src"] for state in old])["src"]
    assert merged["counters"]["empty_skipped"] == 3
    new = [state_of(40, rank=rank, world_size=3) for rank in range(3)]
    for state in new:
        state.load_global(merged)
    assert [state.counters.empty_skipped for state in new] == [0, 0, 0]  # split on first use only
    plans = [state.walk().plan for state in new]
    assert [state.counters.empty_skipped for state in new] == [3, 0, 0]
    assert sum(len(plan) for plan in plans) == (20 - 5) + (20 - 9)  # every position the old shards left in the pass


def test_the_state_after_no_document_of_a_block_is_its_start_state():
    source = ArrowSource(gappy_table(60), "src", seed=1, max_seq_len=5)
    source.read_block(10)
    block = source.read_block(10)
    assert source.state_after_block(block, 0) == block.start_state
    assert block.start_state != source.state_dict()


def test_a_pickled_state_settles_the_documents_read_and_leaves_the_cursor_behind():
    state = state_of(30)
    plan = state.walk().plan
    state.cursor = [plan, 4, 0]  # four documents of a block read, none applied yet
    copy = pickle.loads(pickle.dumps(state))
    assert copy.cursor is None and copy.walk().plan.taken == 4 and plan.taken == 4


def test_state_is_small_and_constant_in_how_far_the_stream_went():
    stream = ArrowSource(table(50), "src")
    iterator = iter(stream)
    early = stream.state_dict()
    for _ in range(5001):
        next(iterator)
    late = stream.state_dict()
    assert early.keys() == late.keys() == {"src"}
    plan = late["src"]["walk"]["plan"]
    assert (plan["epoch"], plan["tail_taken"]) == (100, 1)
    assert len(json.dumps(late)) <= len(json.dumps(early)) + 4  # plain types, the same size at any step


@pytest.mark.parametrize("overlong", ["truncate", "drop"])
def test_snapshot_built_later_equals_the_state_of_its_moment_across_passes(overlong: str):
    stream = ArrowSource(table(20), "src", seed=3, max_seq_len=4, overlong=overlong)
    iterator = iter(stream)
    moments = []
    for _ in range(50):  # across two pass boundaries, with skipped (dropped) rows counted
        moments.append((stream.snapshot(), json.loads(json.dumps(stream.state_dict()))))
        next(iterator)
    for snapshot, expected in moments:
        assert snapshot() == expected
    assert len({json.dumps(expected, sort_keys=True) for _, expected in moments}) == len(moments)  # every step moved on


def test_loading_a_state_from_another_shard_layout_fails_naming_it():
    stream = ArrowSource(table(20), "src", rank=0, world_size=2)
    state = stream.state_dict()
    single = ArrowSource(table(20), "src")
    with pytest.raises(ValueError, match="shard 0 of 2.*shard 0 of 1.*load_shard_states"):
        single.load_state_dict(state)


def test_state_loads_with_weights_only_torch_load(tmp_path):
    stream = ArrowSource(table(10), "src")
    take(stream, 4)
    torch.save(stream.state_dict(), tmp_path / "state.pt")
    assert torch.load(tmp_path / "state.pt", weights_only=True) == stream.state_dict()


@pytest.mark.parametrize("overlong", ["truncate", "drop"])
def test_state_after_every_document_counts_exactly_the_rows_read_so_far(overlong: str):
    # 1300 rows: several blocks of reads; empty and overlong rows are skipped (or cut) anywhere in a block.
    rows = gappy_table(1300)
    lengths = [len(r) for r in rows.column("input_ids").to_pylist()]
    stream = ArrowSource(rows, "src", shuffle=False, max_seq_len=5, overlong=overlong)
    iterator = iter(stream)
    for _ in range(1700):  # into the second pass
        sample = next(iterator)
        row, epoch = sample["source_row"], sample["epoch"]
        state = stream.state_dict()["src"]
        assert (state["walk"]["plan"]["epoch"], state["walk"]["plan"]["tail_taken"]) == (epoch, row + 1)
        before = lengths[: row + 1] if epoch == 0 else lengths + lengths[: row + 1]
        counters = state["counters"]
        assert counters["empty_skipped"] == before.count(0)
        skipped_or_cut = sum(n > 5 for n in before)
        assert counters["overlong_dropped" if overlong == "drop" else "overlong_truncated"] == skipped_or_cut


@pytest.mark.parametrize("overlong", ["truncate", "drop"])
def test_state_after_part_of_a_block_equals_the_state_after_reading_that_many_documents(overlong: str):
    # Blocks of 97 rows over 700 gappy rows, shuffled, into the third pass: after every k documents of
    # every block, the block's state equals the state of the same source read one document at a time.
    rows = gappy_table(700)
    by_block = ArrowSource(rows, "src", seed=3, max_seq_len=5, overlong=overlong)
    by_document = ArrowSource(rows, "src", seed=3, max_seq_len=5, overlong=overlong)
    documents = iter(by_document)
    checked = 0
    for _ in range(20):
        block = by_block.read_block(97)
        if block.start_state["src"]["walk"]["plan"]["tail_taken"]:  # (at a new pass: the same place, said differently)
            assert by_block.state_after_block(block, 0) == by_document.state_dict()
        for k in range(1, len(block.rows) + 1):
            sample = next(documents)
            assert (sample["source_row"], sample["epoch"]) == (block.rows[k - 1], block.epoch)
            assert by_block.state_after_block(block, k) == by_document.state_dict()
            checked += 1
    assert checked > 1400  # past two passes
    resumed = ArrowSource(rows, "src", seed=3, max_seq_len=5, overlong=overlong)
    resumed.load_state_dict(json.loads(json.dumps(by_block.state_after_block(block, 40))))
    assert described(take(resumed, 30)) == described([s for s in take_after(block, rows, overlong, 40, 30)])


def take_after(block, rows: pa.Table, overlong: str, done: int, count: int) -> list[dict]:
    """``count`` documents read one at a time from a fresh source after ``done`` documents of ``block``."""
    stream = ArrowSource(rows, "src", seed=3, max_seq_len=5, overlong=overlong)
    iterator = iter(stream)
    while True:
        sample = next(iterator)
        if (sample["source_row"], sample["epoch"]) == (block.rows[done - 1], block.epoch):
            break
    return [next(iterator) for _ in range(count)]


class _Windowed:
    """An order holder that can read windowed orders (as a store read whole can)."""

    def __init__(self, order=None) -> None:  # noqa: ANN001
        self.order = order

    def order_state(self):  # noqa: ANN201
        return self.order

    def adopt_order(self, order) -> None:  # noqa: ANN001
        self.order = order


def test_a_loaded_state_adopts_the_saved_windowed_order_and_saved_orders_finds_it_in_any_nesting():
    order = {"block_rows": 4, "window_blocks": 2}
    written = ArrowSourceState("src", 20, StreamSettings(), SourceCounters(), _Windowed(order))
    saved = written.state_dict()
    assert saved["src"]["order"] == order
    holder = _Windowed()
    loaded = ArrowSourceState("src", 20, StreamSettings(), SourceCounters(), holder)
    loaded.load_state_dict(saved["src"])
    assert holder.order == order and loaded.state_dict() == saved
    nested = [{"packer": {"child": {"children": {**saved, "other": state_of().state_dict()["src"]}}}}]
    from lightning_tune_data.sources.arrow_state import saved_orders
    assert saved_orders(nested) == {"src": order, "other": None}
    assert saved_orders([{"other": state_of().state_dict()["src"]}]) == {"other": None}


def test_a_windowed_position_is_refused_by_a_reader_of_the_full_shuffle_only():
    saved = ArrowSourceState("src", 20, StreamSettings(), SourceCounters(),
                             _Windowed({"block_rows": 4, "window_blocks": 2})).state_dict()["src"]
    with pytest.raises(ValueError, match=r"Source 'src': the checkpoint's position is in shuffle windows of 8 rows, "
                                         r"which this run cannot read"):
        state_of().load_state_dict(saved)
