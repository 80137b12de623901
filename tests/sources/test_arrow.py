"""ArrowSource: infinite passes, per-pass permutations, rank x worker sharding, O(1) exact state."""

from __future__ import annotations

import json
import pickle
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_tune_data.sources.arrow import ArrowSource, ListColumn


def table(num_rows: int, with_mask: bool = False) -> pa.Table:
    """Row i holds tokens [i, i, ...] (1 + i % 7 of them): the first token identifies the row."""
    ids = [[i] * (1 + i % 7) for i in range(num_rows)]
    columns = {"input_ids": pa.array(ids, type=pa.list_(pa.int32()))}
    if with_mask:
        columns["loss_mask"] = pa.array([[j % 2 == 0 for j in range(len(r))] for r in ids], type=pa.list_(pa.bool_()))
    return pa.table(columns)


def take(stream, count: int) -> list[dict]:
    iterator = iter(stream)
    return [next(iterator) for _ in range(count)]


def rows_of(samples: list[dict]) -> list[int]:
    return [int(s["input_ids"][0]) for s in samples]


def test_each_pass_visits_every_row_once_in_a_new_order():
    stream = ArrowSource(table(20), "src", seed=3)
    samples = take(stream, 60)
    passes = [rows_of(samples[i : i + 20]) for i in (0, 20, 40)]
    for number, rows in enumerate(passes):
        assert sorted(rows) == list(range(20))
        assert {s["epoch"] for s in samples[number * 20 : (number + 1) * 20]} == {number}
    assert passes[0] != passes[1] != passes[2]


def test_order_of_a_pass_is_a_pure_function_of_seed_and_pass():
    first = rows_of(take(ArrowSource(table(30), "src", seed=11), 90))
    second = rows_of(take(ArrowSource(table(30), "src", seed=11), 90))
    other = rows_of(take(ArrowSource(table(30), "src", seed=12), 90))
    assert first == second
    assert first != other


def test_shuffle_false_keeps_file_order():
    assert rows_of(take(ArrowSource(table(5), "src", shuffle=False), 10)) == [0, 1, 2, 3, 4] * 2


def test_samples_are_zero_copy_views_with_source_and_loss_mask():
    sample = take(ArrowSource(table(8, with_mask=True), "docs", shuffle=False), 4)[3]
    assert sample["source"] == "docs" and sample["epoch"] == 0
    assert sample["input_ids"].tolist() == [3, 3, 3, 3]
    assert sample["loss_mask"].dtype == np.bool_ and sample["loss_mask"].tolist() == [True, False, True, False]


@pytest.mark.parametrize("stop_at", [0, 1, 7, 19, 20, 21, 45])
def test_state_after_k_samples_resumes_bitwise_including_across_pass_boundaries(stop_at: int):
    reference = ArrowSource(table(20), "src", seed=5)
    iterator = iter(reference)
    for _ in range(stop_at):
        next(iterator)
    state = pickle.loads(pickle.dumps(reference.state_dict()))
    expected = [next(iterator) for _ in range(30)]

    resumed = ArrowSource(table(20), "src", seed=5)
    resumed.load_state_dict(state)
    got = take(resumed, 30)
    assert rows_of(got) == rows_of(expected)
    assert [s["epoch"] for s in got] == [s["epoch"] for s in expected]


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


def test_empty_documents_are_skipped_and_counted_and_an_all_empty_source_is_an_error_not_a_hang():
    mixed = pa.table({"input_ids": pa.array([[1], [], [2, 2], []], type=pa.list_(pa.int32()))})
    stream = ArrowSource(mixed, "gaps", shuffle=False)
    assert rows_of(take(stream, 4)) == [1, 2, 1, 2]
    assert stream.counters["empty_skipped"] == 3  # the last empty row of pass 1 is not reached yet
    empty = pa.table({"input_ids": pa.array([[]] * 6, type=pa.list_(pa.int32()))})
    with pytest.raises(RuntimeError, match=r"Source 'blank'.*shard 0 of 1.*empty: 6"):
        next(iter(ArrowSource(empty, "blank")))


def test_one_worker_shard_with_only_empty_documents_fails_naming_the_shard():
    rows = [[], [7], [], [8], [], [9], [], [6]]  # shard 0 of 2 (no shuffle) gets only the empty rows
    data = pa.table({"input_ids": pa.array(rows, type=pa.list_(pa.int32()))})
    loader = StatefulDataLoader(ArrowSource(data, "half", shuffle=False), batch_size=1, num_workers=2,
                                collate_fn=lambda b: b)
    with pytest.raises(RuntimeError, match="shard 0 of 2"):
        list(zip(range(10), loader))


def test_resume_with_another_worker_count_reads_every_row_of_the_pass_exactly_once():
    def loader(num_workers):
        return StatefulDataLoader(ArrowSource(table(60), "src", seed=4), batch_size=2, num_workers=num_workers,
                                  collate_fn=lambda b: [int(s["input_ids"][0]) for s in b])

    old = loader(2)
    iterator = iter(old)
    seen = [row for _ in range(7) for row in next(iterator)]
    state = old.state_dict()
    shard_states = [snapshot["dataset_state"] for snapshot in state["_snapshot"]["_worker_snapshots"].values()]
    del iterator, old

    stream = ArrowSource(table(60), "src", seed=4)
    stream.load_shard_states(shard_states)
    resumed = StatefulDataLoader(stream, batch_size=2, num_workers=3, collate_fn=lambda b: [int(s["input_ids"][0]) for s in b])
    iterator = iter(resumed)
    while len(seen) < 60:
        seen += next(iterator)
    assert sorted(seen) == list(range(60))


def test_two_ranks_with_two_workers_partition_each_pass_with_equal_counts():
    num_rows = 103  # 103 = 4 * 25 + 3: three rows are the documented per-pass remainder
    seen: Counter = Counter()
    per_rank = []
    for rank in (0, 1):
        stream = ArrowSource(table(num_rows), "src", seed=1, rank=rank, world_size=2, num_passes=1)
        loader = StatefulDataLoader(stream, batch_size=5, num_workers=2, collate_fn=lambda batch: batch)
        rows = [int(s["input_ids"][0]) for batch in loader for s in batch]
        per_rank.append(len(rows))
        seen.update(rows)
    assert per_rank == [50, 50]
    assert set(seen.values()) == {1}, "no row may be read twice in one pass"
    assert len(seen) == num_rows - 3


def test_worker_states_resume_exactly_through_stateful_dataloader():
    def loader():
        stream = ArrowSource(table(40), "src", seed=2)
        return StatefulDataLoader(stream, batch_size=3, num_workers=2, collate_fn=lambda b: [int(s["input_ids"][0]) for s in b])

    reference = loader()
    iterator = iter(reference)
    for _ in range(9):
        next(iterator)
    state = reference.state_dict()
    expected = [next(iterator) for _ in range(20)]

    resumed = loader()
    resumed.load_state_dict(state)
    iterator = iter(resumed)
    assert [next(iterator) for _ in range(20)] == expected


def test_more_shards_than_rows_is_a_clear_error():
    stream = ArrowSource(table(3), "tiny", rank=0, world_size=4)
    with pytest.raises(ValueError, match="fewer than its 4 shards"):
        next(iter(stream))


def test_loading_a_state_from_another_shard_layout_fails_naming_it():
    stream = ArrowSource(table(20), "src", rank=0, world_size=2)
    state = stream.state_dict()
    single = ArrowSource(table(20), "src")
    with pytest.raises(ValueError, match="shard 0 of 2.*shard 0 of 1.*load_shard_states"):
        single.load_state_dict(state)


def test_overlong_documents_are_truncated_or_dropped_and_counted():
    truncating = ArrowSource(table(14), "src", shuffle=False, max_seq_len=3, overlong="truncate")
    assert max(len(s["input_ids"]) for s in take(truncating, 14)) == 3
    samples = take(truncating, 14)
    assert truncating.counters["overlong_truncated"] == 16  # rows with 4..7 tokens, two passes
    assert sum(s.get("truncated_tokens", 0) for s in samples) == 2 * (1 + 2 + 3 + 4)
    dropping = ArrowSource(table(14), "src", shuffle=False, max_seq_len=3, overlong="drop")
    kept = take(dropping, 6)
    assert all(len(s["input_ids"]) <= 3 for s in kept)
    assert dropping.counters["overlong_dropped"] >= 4
    assert sum(s.get("dropped_before", 0) for s in kept) == 4  # the four rows of 4..7 tokens in pass 0


def test_failing_transform_rows_are_skipped_until_the_budget_then_raise_with_the_row():
    def explode_on_five(sample):
        if int(sample["input_ids"][0]) == 5:
            raise ValueError("bad row")
        return sample

    tolerant = ArrowSource(table(10), "src", shuffle=False, model_transform=explode_on_five, max_error_count=1)
    assert 5 not in rows_of(take(tolerant, 9))
    assert tolerant.counters["errors"] == 1

    strict = ArrowSource(table(10), "src", shuffle=False, model_transform=explode_on_five, max_error_count=0)
    with pytest.raises(RuntimeError, match=r"(?s)max_error_count=0.*row 5.*bad row"):
        take(strict, 10)


def test_filter_that_drops_everything_is_an_error_not_a_hang():
    stream = ArrowSource(table(10), "src", filter_fn=lambda sample: False)
    with pytest.raises(RuntimeError, match="produced no usable document"):
        next(iter(stream))


def test_filter_kwargs_are_passed_to_filter_fn():
    stream = ArrowSource(table(10), "src", shuffle=False, filter_fn=lambda s, limit: s["input_ids"][0] < limit,
                         filter_kwargs={"limit": 4})
    assert rows_of(take(stream, 8)) == [0, 1, 2, 3] * 2


def test_state_loads_with_weights_only_torch_load(tmp_path):
    stream = ArrowSource(table(10), "src")
    take(stream, 4)
    torch.save(stream.state_dict(), tmp_path / "state.pt")
    assert torch.load(tmp_path / "state.pt", weights_only=True) == stream.state_dict()


def test_rows_are_read_right_across_many_chunks():
    chunked = pa.concat_tables([table(5).slice(0, 5), table(12).slice(5, 7), table(20).slice(12, 8)])
    assert chunked.column("input_ids").num_chunks == 3
    stream = ArrowSource(chunked, "src", shuffle=False)
    assert rows_of(take(stream, 20)) == list(range(20))
    assert [len(s["input_ids"]) for s in take(ArrowSource(chunked, "src", shuffle=False), 20)] == [1 + i % 7 for i in range(20)]


def test_rows_read_through_the_flat_view_equal_the_per_chunk_views():
    chunked = pa.concat_tables([table(40).slice(0, 9), table(40).slice(9, 0), table(40).slice(9, 31)])
    indices = np.random.default_rng(0).permutation(40)
    flat = ListColumn(chunked.column("input_ids"), "input_ids", "src")
    assert flat.flat() is not None
    per_chunk = ListColumn(chunked.column("input_ids"), "input_ids", "src")
    per_chunk._flat = None  # as for values with no flat view: one lookup per row in its chunk
    got, expected = flat.rows(indices), per_chunk.rows(indices)
    assert [row.tolist() for row in got] == [row.tolist() for row in expected] == [[i] * (1 + i % 7) for i in indices]
    assert {row.dtype for row in got} == {row.dtype for row in expected} == {np.dtype(np.int32)}
    assert not any(row.flags.writeable for row in got)


def test_a_column_of_very_many_chunks_reads_rows_chunk_by_chunk_without_building_the_flat_view(monkeypatch):
    import lightning_tune_data.sources.arrow as arrow_source

    monkeypatch.setattr(arrow_source, "_FLAT_ROWS_MAX_CHUNKS", 2)
    chunked = pa.concat_tables([table(40).slice(0, 9), table(40).slice(9, 20), table(40).slice(29, 11)])
    column = ListColumn(chunked.column("input_ids"), "input_ids", "src")
    indices = np.random.default_rng(1).permutation(40)
    assert [row.tolist() for row in column.rows(indices)] == [[i] * (1 + i % 7) for i in indices]
    assert column._flat is False  # not built: its one-time cost grows with the number of chunks
    assert column.flat() is not None  # once built (the packer builds it), rows are read through it
    assert [row.tolist() for row in column.rows(indices)] == [[i] * (1 + i % 7) for i in indices]


def gappy_table(num_rows: int) -> pa.Table:
    """Row i holds [i] * n with n = 0 (every 11th row), 9 (overlong for max_seq_len=5) or 1..4."""
    def length(i: int) -> int:
        return 0 if i % 11 == 3 else 9 if i % 13 == 5 else 1 + i % 4

    return pa.table({"input_ids": pa.array([[i] * length(i) for i in range(num_rows)], type=pa.list_(pa.int32()))})


def described(samples: list[dict]) -> list[tuple]:
    return [
        (s["source_row"], s["epoch"], s["input_ids"].tolist(), s.get("truncated_tokens"), s.get("dropped_before"))
        for s in samples
    ]


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


@pytest.mark.parametrize("stop_at", [0, 1, 2, 300, 450, 451, 452, 903, 1150, 1400])
def test_resume_from_a_state_taken_mid_block_continues_identically(stop_at: int):
    reference = ArrowSource(gappy_table(1100), "src", seed=9, max_seq_len=5)
    iterator = iter(reference)
    for _ in range(stop_at):
        next(iterator)
    state = pickle.loads(pickle.dumps(reference.state_dict()))
    expected = [next(iterator) for _ in range(600)]  # crosses block and pass boundaries

    resumed = ArrowSource(gappy_table(1100), "src", seed=9, max_seq_len=5)
    resumed.load_state_dict(state)
    assert described(take(resumed, 600)) == described(expected)
    assert resumed.counters == reference.counters


def test_taking_the_state_mid_block_does_not_change_what_the_stream_yields():
    untouched = take(ArrowSource(gappy_table(700), "src", seed=4, max_seq_len=5, overlong="drop"), 1500)
    observed = ArrowSource(gappy_table(700), "src", seed=4, max_seq_len=5, overlong="drop")
    iterator, samples = iter(observed), []
    for _ in range(1500):
        samples.append(next(iterator))
        observed.state_dict()
    assert described(samples) == described(untouched)


def test_a_source_pickled_mid_iteration_continues_after_the_documents_read():
    stream = ArrowSource(gappy_table(900), "src", seed=2, max_seq_len=5)
    iterator = iter(stream)
    for _ in range(333):
        next(iterator)
    copy = pickle.loads(pickle.dumps(stream))
    assert described(take(copy, 500)) == described([next(iterator) for _ in range(500)])


def test_resume_mid_block_with_a_loss_mask_and_a_transform_continues_identically():
    def tag(sample):
        return dict(sample, tagged=True)

    def source():
        return ArrowSource(table(1200, with_mask=True), "src", seed=1, model_transform=tag, max_seq_len=4)

    reference = source()
    iterator = iter(reference)
    for _ in range(700):
        next(iterator)
    state = reference.state_dict()
    expected = [next(iterator) for _ in range(300)]
    resumed = source()
    resumed.load_state_dict(state)
    got = take(resumed, 300)
    assert described(got) == described(expected)
    assert [s["loss_mask"].tolist() for s in got] == [s["loss_mask"].tolist() for s in expected]


def _row_views_and_flat_reads(chunked: pa.Table) -> tuple[list[list[int]], list[list[int]]]:
    """Every row as the row view reads it, and as its position and length in the flat values read it."""
    source = ArrowSource(chunked, "src", shuffle=False)
    source._columns()
    column = source._input_ids
    rows = np.arange(len(column))
    flat = column.flat()
    assert flat is not None
    positions, lengths = flat.positions(rows)
    by_view = [view.tolist() for view in column.rows(rows)]
    by_position = [flat.values[p : p + n].tolist() for p, n in zip(positions.tolist(), lengths.tolist())]
    return by_view, by_position


@pytest.mark.parametrize("value_type", [pa.int32(), pa.int64(), pa.uint16()])
@pytest.mark.parametrize("large", [False, True])
def test_flat_positions_read_the_same_tokens_as_row_views_across_slices_and_empty_chunks(value_type, large):
    list_type = (pa.large_list if large else pa.list_)(value_type)

    def part(start: int, stop: int) -> pa.Table:
        ids = [[i % 50] * (i % 5) for i in range(stop)]  # every fifth document is empty
        return pa.table({"input_ids": pa.array(ids, type=list_type)}).slice(start, stop - start)

    values = pa.array(np.arange(100) % 50, type=value_type).slice(30)  # lists over a sliced values array
    offsets = pa.array([0, 4, 4, 11], type=pa.int64() if large else pa.int32())
    over_slice = (pa.LargeListArray if large else pa.ListArray).from_arrays(offsets, values)
    empty = part(0, 0)
    chunked = pa.concat_tables([part(3, 10), empty, part(0, 1), part(20, 41), empty,
                                pa.table({"input_ids": over_slice}), part(7, 9)])
    assert chunked.column("input_ids").num_chunks == 7
    by_view, by_position = _row_views_and_flat_reads(chunked)
    assert by_position == by_view and len(by_view) == 7 + 1 + 21 + 3 + 2
    assert by_view[29:32] == [[30, 31, 32, 33], [], [34, 35, 36, 37, 38, 39, 40]]


@pytest.mark.parametrize("chunk_rows", [[7, 7, 7, 3], [7, 7, 7, 12], [7], [7, 7, 5, 7], [7, 7, 0, 7]])
def test_flat_positions_of_shuffled_rows_match_row_views_with_equal_and_unequal_chunks(chunk_rows):
    ids = [[i] * (1 + i % 4) for i in range(sum(chunk_rows))]
    parts, start = [], 0
    for count in chunk_rows:
        parts.append(pa.table({"input_ids": pa.array(ids[start : start + count], type=pa.list_(pa.int32()))}))
        start += count
    source = ArrowSource(pa.concat_tables(parts), "src", shuffle=False)
    source._columns()
    flat = source._input_ids.flat()
    rows = np.random.default_rng(0).permutation(len(ids))
    positions, lengths = flat.positions(rows)
    got = [flat.values[p : p + n].tolist() for p, n in zip(positions.tolist(), lengths.tolist())]
    assert got == [ids[row] for row in rows.tolist()]


def test_flat_positions_span_a_datasets_cache_saved_as_several_memory_mapped_files(tmp_path):
    datasets = pytest.importorskip("datasets")
    ids = [[i] * (1 + i % 9) for i in range(400)]
    datasets.Dataset.from_dict({"input_ids": ids}).save_to_disk(str(tmp_path / "ds"), num_shards=3)
    loaded = datasets.load_from_disk(str(tmp_path / "ds"))
    assert len(loaded.cache_files) == 3
    by_view, by_position = _row_views_and_flat_reads(loaded.data.table)
    assert by_position == by_view == ids


@pytest.mark.parametrize("values", [
    pa.array([[1, None, 3], [4]], type=pa.list_(pa.int32())),  # a missing token
    pa.array([[1.5, 2.0], [3.0]], type=pa.list_(pa.float32())),  # not token ids
])
def test_values_that_are_not_null_free_integers_have_no_flat_view(values):
    source = ArrowSource(pa.table({"input_ids": values}), "src")
    source._columns()
    assert source._input_ids.flat() is None


def test_flat_positions_span_memory_mapped_and_in_memory_chunks_far_apart(tmp_path):
    path = tmp_path / "docs.arrow"
    on_disk = pa.table({"input_ids": pa.array([[i] * (1 + i % 4) for i in range(300)], type=pa.list_(pa.int32()))})
    with pa.ipc.new_file(str(path), on_disk.schema) as writer:
        writer.write_table(on_disk, max_chunksize=64)
    mapped = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
    in_memory = pa.table({"input_ids": pa.array([[7, 8, 9]] * 5, type=pa.list_(pa.int32()))})
    by_view, by_position = _row_views_and_flat_reads(pa.concat_tables([in_memory, mapped, in_memory]))
    assert by_position == by_view and len(by_view) == 310
