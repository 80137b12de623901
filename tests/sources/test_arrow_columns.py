"""Column readers: zero-copy row views of a list column, and the flat view of its values (positions
and lengths, across slices, empty chunks, memory-mapped files and memory far apart)."""

from __future__ import annotations

import datasets as hf_datasets
import numpy as np
import pyarrow as pa
import pytest

import lightning_tune_data.sources.arrow_columns as arrow_columns
from lightning_tune_data.sources.arrow_columns import FlatColumn, ListColumn, arrow_table

from source_tables import table


def test_arrow_table_is_the_table_behind_a_dataset_with_a_selection_applied():
    rows = table(10)
    assert arrow_table(rows) is rows
    dataset = hf_datasets.Dataset(rows)
    assert arrow_table(dataset).equals(rows)
    selected = arrow_table(dataset.select([7, 2]))
    assert selected.column("input_ids").to_pylist() == [[7], [2] * 3]  # row i holds 1 + i % 7 tokens


def test_a_single_chunk_column_reads_rows_lengths_and_one_row_at_a_time():
    column = ListColumn(table(12).column("input_ids"), "input_ids", "src")
    assert len(column) == 12
    assert column.row(5).tolist() == [5] * 6
    views, lengths = column.rows_and_lengths(np.array([3, 0, 11]))
    assert [view.tolist() for view in views] == [[3] * 4, [0], [11] * 5] and lengths.tolist() == [4, 1, 5]
    assert column.lengths().tolist() == [1 + i % 7 for i in range(12)]


def test_one_row_of_a_many_chunk_column_is_found_in_its_chunk():
    chunked = pa.concat_tables([table(30).slice(0, 4), table(30).slice(4, 0), table(30).slice(4, 26)])
    column = ListColumn(chunked.column("input_ids"), "input_ids", "src")
    assert [column.row(i).tolist() for i in (0, 3, 4, 29)] == [[0], [3] * 4, [4] * 5, [29] * 2]
    assert column.lengths().tolist() == [1 + i % 7 for i in range(30)]


def test_a_column_that_is_not_a_list_column_fails_naming_source_and_column():
    column = ListColumn(pa.chunked_array([pa.array([1, 2, 3])]), "input_ids", "web")
    with pytest.raises(TypeError, match="Source 'web': column 'input_ids' has type int64, expected a list"):
        column.row(0)


def test_the_flat_view_finds_rows_of_equal_chunks_by_division_and_of_unequal_ones_by_search():
    equal = pa.concat_tables([table(21).slice(0, 7), table(21).slice(7, 7), table(21).slice(14, 7)])
    unequal = pa.concat_tables([table(21).slice(0, 5), table(21).slice(5, 16)])
    rows = np.array([20, 0, 6, 7, 13, 14])
    for chunked in (equal, unequal):
        column = chunked.column("input_ids")
        flat = FlatColumn.of(column, np.concatenate([[0], np.cumsum([len(chunk) for chunk in column.chunks])]))
        positions, lengths = flat.positions(rows)
        assert [flat.values[p : p + n].tolist() for p, n in zip(positions.tolist(), lengths.tolist())] == [
            [row] * (1 + row % 7) for row in rows.tolist()]


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
    monkeypatch.setattr(arrow_columns, "_FLAT_ROWS_MAX_CHUNKS", 2)
    chunked = pa.concat_tables([table(40).slice(0, 9), table(40).slice(9, 20), table(40).slice(29, 11)])
    column = ListColumn(chunked.column("input_ids"), "input_ids", "src")
    indices = np.random.default_rng(1).permutation(40)
    assert [row.tolist() for row in column.rows(indices)] == [[i] * (1 + i % 7) for i in indices]
    assert column._flat is False  # not built: its one-time cost grows with the number of chunks
    assert column.flat() is not None  # once built (the packer builds it), rows are read through it
    assert [row.tolist() for row in column.rows(indices)] == [[i] * (1 + i % 7) for i in indices]


def _row_views_and_flat_reads(chunked: pa.Table) -> tuple[list[list[int]], list[list[int]]]:
    """Every row as the row view reads it, and as its position and length in the flat values read it."""
    column = ListColumn(arrow_table(chunked).column("input_ids"), "input_ids", "src")
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
    flat = ListColumn(pa.concat_tables(parts).column("input_ids"), "input_ids", "src").flat()
    rows = np.random.default_rng(0).permutation(len(ids))
    positions, lengths = flat.positions(rows)
    got = [flat.values[p : p + n].tolist() for p, n in zip(positions.tolist(), lengths.tolist())]
    assert got == [ids[row] for row in rows.tolist()]


def test_flat_positions_span_a_datasets_cache_saved_as_several_memory_mapped_files(tmp_path):
    ids = [[i] * (1 + i % 9) for i in range(400)]
    hf_datasets.Dataset.from_dict({"input_ids": ids}).save_to_disk(str(tmp_path / "ds"), num_shards=3)
    loaded = hf_datasets.load_from_disk(str(tmp_path / "ds"))
    assert len(loaded.cache_files) == 3
    by_view, by_position = _row_views_and_flat_reads(loaded.data.table)
    assert by_position == by_view == ids


@pytest.mark.parametrize("values", [
    pa.array([[1, None, 3], [4]], type=pa.list_(pa.int32())),  # a missing token
    pa.array([[1.5, 2.0], [3.0]], type=pa.list_(pa.float32())),  # not token ids
])
def test_values_that_are_not_null_free_integers_have_no_flat_view(values):
    assert ListColumn(pa.table({"input_ids": values}).column("input_ids"), "input_ids", "src").flat() is None


def test_flat_positions_span_memory_mapped_and_in_memory_chunks_far_apart(tmp_path):
    path = tmp_path / "docs.arrow"
    on_disk = pa.table({"input_ids": pa.array([[i] * (1 + i % 4) for i in range(300)], type=pa.list_(pa.int32()))})
    with pa.ipc.new_file(str(path), on_disk.schema) as writer:
        writer.write_table(on_disk, max_chunksize=64)
    mapped = pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()
    in_memory = pa.table({"input_ids": pa.array([[7, 8, 9]] * 5, type=pa.list_(pa.int32()))})
    by_view, by_position = _row_views_and_flat_reads(pa.concat_tables([in_memory, mapped, in_memory]))
    assert by_position == by_view and len(by_view) == 310


def test_list_view_chunks_with_gaps_between_rows_read_as_their_rows():
    from lightning_tune_data.sources.lengths import document_lengths

    rows, chunks = [], []
    for chunk_number, count in enumerate([5, 0, 7]):
        values = np.arange(1000 * chunk_number, 1000 * chunk_number + 200, dtype=np.uint16)  # gaps hold other ids
        starts = np.arange(count, dtype=np.int64) * 20 + 3
        sizes = np.arange(count, dtype=np.int64) % 4 + 1
        chunks.append(pa.LargeListViewArray.from_arrays(pa.array(starts), pa.array(sizes), pa.array(values)))
        rows += [values[a : a + n].tolist() for a, n in zip(starts, sizes)]
    whole = pa.chunked_array([*chunks, chunks[2].slice(2, 4)])
    rows += rows[-7:][2:6]
    column = ListColumn(whole, "input_ids", "src")
    assert [column.row(i).tolist() for i in range(len(rows))] == rows
    picked = np.array([11, 0, 4, 15, 7])
    views, lengths = column.rows_and_lengths(picked)
    assert [view.tolist() for view in views] == [rows[i] for i in picked]
    assert lengths.tolist() == [len(rows[i]) for i in picked]
    assert column.lengths().tolist() == [len(row) for row in rows]
    as_dataset = type("Cached", (), {"data": pa.table({"input_ids": whole})})()  # what a corpus hands out
    assert document_lengths(as_dataset).tolist() == [len(row) for row in rows]
    flat = column.flat()
    assert flat is not None and flat.sizes is not None
    starts, lengths = flat.positions(np.arange(len(rows)))
    assert [flat.values[a : a + n].tolist() for a, n in zip(starts, lengths)] == rows
