"""A store's shards: immutable Arrow IPC files of bounded size, written in row order and
memory-mapped back as one dataset.

A shard is an Arrow IPC stream file (the format ``datasets`` memory-maps) holding whole rows of
the token columns. Any row is read by its global index without touching other shards: the
manifest gives each shard's row count, and each shard's record batches give the offsets inside it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from datasets.table import ConcatenationTable, MemoryMappedTable

from lightning_tune_data.cache.checksums import CHECKSUM_ALGORITHM, file_checksum
from lightning_tune_data.keys import INPUT_IDS

__all__ = [
    "BATCH_BYTES", "ROWS_PER_BATCH", "SHARD_FOLDER", "ShardRecord", "open_shards", "shard_name", "write_shards",
]

#: Folder of a store that holds the shards (one sub-folder per task).
SHARD_FOLDER = "shards"
#: Rows per Arrow record batch the shards were written with before :data:`BATCH_BYTES` (kept
#: for callers; shards of either layout are read alike).
ROWS_PER_BATCH = 1000
#: A shard's record batches hold about this many bytes (at most the shard size, at least one
#: row). Opening a shard reads every batch's header (~25 us each): with batches of 1,000 rows
#: (~1 MB of tokens) that was ~2.5 ms per 100 MB, twice per start, so opens grew with the store.
BATCH_BYTES = 32 << 20


@dataclass(frozen=True)
class ShardRecord:
    """What was written to one shard.

    Attributes:
        path: The shard's path relative to the store folder (posix).
        rows: Documents it holds.
        tokens: Token ids it holds.
        size: Its size in bytes.
        checksum: ``xxh3_128`` of its bytes, computed when it was written.
    """

    path: str
    rows: int
    tokens: int
    size: int
    checksum: str

    def as_json(self) -> dict[str, Any]:
        """The record as stored in a task manifest (the checksum under its algorithm's name)."""
        record = asdict(self)
        record[CHECKSUM_ALGORITHM] = record.pop("checksum")
        return record

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> ShardRecord:
        """Read a record written by :meth:`as_json`."""
        return cls(record["path"], int(record["rows"]), int(record["tokens"]), int(record["size"]),
                   str(record[CHECKSUM_ALGORITHM]))


def shard_name(task_folder: str, number: int) -> str:
    """``shards/<task_folder>/<number>.arrow``: a shard's path inside its store.

    Args:
        task_folder: The writing task's name (``task-00003-of-00008``).
        number: The shard's number within the task.
    """
    return f"{SHARD_FOLDER}/{task_folder}/{number:05d}.arrow"


def _batches(table: pa.Table, batch_bytes: int) -> Iterator[pa.RecordBatch]:
    """The table's rows, in order, as record batches of about ``batch_bytes`` (consecutive
    chunks combined, one copy of at most ``batch_bytes`` at a time; a bigger chunk is sliced,
    without a copy, so a shard can be smaller than the chunks the table was written in)."""
    group: list[pa.RecordBatch] = []
    size = 0
    for batch in _sliced(table.to_batches(), batch_bytes):
        if not batch.num_rows:
            continue
        group.append(batch)
        size += batch.nbytes
        if size >= batch_bytes:
            yield from _combined(group)
            group, size = [], 0
    if group:
        yield from _combined(group)


def _sliced(batches: list[pa.RecordBatch], batch_bytes: int) -> Iterator[pa.RecordBatch]:
    """``batches`` with each one larger than ``batch_bytes`` cut into zero-copy slices of about that size."""
    for batch in batches:
        if batch.nbytes <= batch_bytes or batch.num_rows < 2:
            yield batch
            continue
        rows = max(1, int(batch.num_rows * batch_bytes / batch.nbytes))
        for start in range(0, batch.num_rows, rows):
            yield batch.slice(start, rows)


def _combined(batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    if len(batches) == 1:
        return batches
    return pa.Table.from_batches(batches).combine_chunks().to_batches()


def _tokens(batch: pa.RecordBatch) -> int:
    column = batch.column(batch.schema.get_field_index(INPUT_IDS))
    return int(pc.sum(pc.list_value_length(column)).as_py() or 0)


def write_shards(table: pa.Table, folder: Path, task_folder: str, shard_bytes: int) -> list[ShardRecord]:
    """Write ``table``'s rows, in order, into shards of about ``shard_bytes`` under ``folder``.

    Each shard is written, fsynced and hashed before the next one starts; at least one shard is
    written (possibly empty, so an empty task is still a finished task).

    Args:
        table: The token columns (``input_ids`` and optionally ``loss_mask``).
        folder: The store folder (or a local staging copy of it).
        task_folder: The writing task's name (names the shards' sub-folder).
        shard_bytes: A shard is closed once its batches hold at least this many bytes.

    Returns:
        One record per shard, in row order.
    """
    records: list[ShardRecord] = []
    batches = _batches(table, min(BATCH_BYTES, shard_bytes))
    pending = next(batches, None)
    while True:
        relative = shard_name(task_folder, len(records))
        path = folder / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = tokens = written = 0
        with pa.OSFile(str(path), "wb") as sink:
            with pa.ipc.new_stream(sink, table.schema) as writer:
                while pending is not None and (written < shard_bytes or rows == 0):
                    writer.write_batch(pending)
                    rows += pending.num_rows
                    tokens += _tokens(pending)
                    written += pending.nbytes
                    pending = next(batches, None)
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
        records.append(ShardRecord(relative, rows, tokens, path.stat().st_size, file_checksum(path)))
        if pending is None:
            return records


def open_shards(folder: Path, shards: Sequence[str], fingerprint: str | None = None) -> datasets.Dataset:
    """Memory-map a store's shards, in order, as one ``datasets.Dataset`` (no bytes are read).

    Args:
        folder: The local store folder.
        shards: The shards' relative paths, in global row order.
        fingerprint: The ``datasets`` fingerprint to give the dataset (the store's own, so it is
            not computed by hashing the table's description on every open).
    """
    tables = [MemoryMappedTable.from_file(str(folder / relative)) for relative in shards]
    non_empty = [table for table in tables if table.num_rows] or tables[:1]
    table = non_empty[0] if len(non_empty) == 1 else ConcatenationTable.from_tables(non_empty)
    if fingerprint is None:
        # What ``datasets`` would compute hashes the memory-mapped table's state with dill (~0.5 ms
        # per open); the same identity, hashed directly: the folder and its immutable shards' paths.
        identity = "\0".join(["lightning_tune_data-store", str(Path(folder).absolute()), *shards])
        fingerprint = xxhash.xxh3_128(identity.encode("utf-8")).hexdigest()
    return datasets.Dataset(table, fingerprint=fingerprint)
