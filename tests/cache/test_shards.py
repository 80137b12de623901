"""Shards: rows written in order into Arrow files of bounded size, each hashed when written, and
memory-mapped back as one dataset with random access by global row."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from lightning_tune_data.cache.checksums import file_checksum
from lightning_tune_data.cache.shards import BATCH_BYTES, ROWS_PER_BATCH, ShardRecord, open_shards, shard_name, write_shards


def token_table(rows: int, with_mask: bool = False) -> pa.Table:
    ids = [[row % 251, row // 251, 7] + [1] * (row % 5) for row in range(rows)]
    columns = {"input_ids": pa.array(ids, type=pa.list_(pa.int32()))}
    if with_mask:
        columns["loss_mask"] = pa.array([[i % 2 == 0 for i in range(len(r))] for r in ids], type=pa.list_(pa.bool_()))
    return chunked(pa.table(columns))


def chunked(table: pa.Table) -> pa.Table:
    """The table in chunks of ROWS_PER_BATCH rows, as the preprocessing map writes it."""
    return pa.Table.from_batches(table.to_batches(max_chunksize=ROWS_PER_BATCH), schema=table.schema)


def test_rows_are_split_into_shards_of_about_the_given_size_in_row_order(tmp_path: Path) -> None:
    table = token_table(5 * ROWS_PER_BATCH + 17, with_mask=True)  # small rows: batches of ROWS_PER_BATCH
    one_batch = table.slice(0, ROWS_PER_BATCH).nbytes
    records = write_shards(table, tmp_path, "task-00000-of-00001", shard_bytes=2 * one_batch)
    assert [r.rows for r in records] == [2 * ROWS_PER_BATCH, 2 * ROWS_PER_BATCH, ROWS_PER_BATCH + 17]
    assert [r.path for r in records] == [shard_name("task-00000-of-00001", i) for i in range(3)]
    for record in records:
        path = tmp_path / record.path
        assert record.size == path.stat().st_size and record.checksum == file_checksum(path)
    assert sum(r.tokens for r in records) == sum(len(ids) for ids in table.column("input_ids").to_pylist())
    reopened = open_shards(tmp_path, [r.path for r in records])
    assert reopened.data.table.to_pylist() == table.to_pylist()
    assert reopened[4001] == table.slice(4001, 1).to_pylist()[0]  # random access by global row


def test_large_rows_are_written_in_record_batches_of_about_batch_bytes(tmp_path: Path) -> None:
    rows = 3 * ROWS_PER_BATCH
    table = chunked(pa.table({"input_ids": pa.array([[i] * 3000 for i in range(rows)], type=pa.list_(pa.int32()))}))
    records = write_shards(table, tmp_path, "task-00000-of-00001", shard_bytes=1 << 40)
    reader = pa.ipc.open_stream(pa.memory_map(str(tmp_path / records[0].path)))
    sizes = [batch.num_rows for batch in reader]
    assert sum(sizes) == rows and len(sizes) == 1  # three 12 MB chunks become one batch of at least BATCH_BYTES
    assert table.nbytes >= BATCH_BYTES > table.nbytes / 3


def test_an_empty_part_still_writes_one_empty_shard_that_opens(tmp_path: Path) -> None:
    records = write_shards(token_table(0), tmp_path, "task-00003-of-00004", shard_bytes=1 << 20)
    assert [(r.rows, r.tokens) for r in records] == [(0, 0)]
    assert len(open_shards(tmp_path, [records[0].path])) == 0
    both = write_shards(token_table(3), tmp_path, "task-00000-of-00004", 1 << 20)
    assert open_shards(tmp_path, [both[0].path, records[0].path])["input_ids"] == token_table(3).column(
        "input_ids").to_pylist()


def test_a_shard_record_round_trips_through_its_json_form() -> None:
    record = ShardRecord("shards/t/00000.arrow", 3, 12, 400, "ab" * 16)
    assert ShardRecord.from_json(record.as_json()) == record
    assert record.as_json()["xxh3_128"] == "ab" * 16
