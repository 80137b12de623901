"""Small Arrow tables whose rows say which row they are, and helpers to read sources in tests."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow as pa


def table(num_rows: int, with_mask: bool = False) -> pa.Table:
    """Row i holds tokens [i, i, ...] (1 + i % 7 of them): the first token identifies the row."""
    ids = [[i] * (1 + i % 7) for i in range(num_rows)]
    columns = {"input_ids": pa.array(ids, type=pa.list_(pa.int32()))}
    if with_mask:
        columns["loss_mask"] = pa.array([[j % 2 == 0 for j in range(len(r))] for r in ids], type=pa.list_(pa.bool_()))
    return pa.table(columns)


def gappy_table(num_rows: int) -> pa.Table:
    """Row i holds [i] * n with n = 0 (every 11th row), 9 (overlong for max_seq_len=5) or 1..4."""
    def length(i: int) -> int:
        return 0 if i % 11 == 3 else 9 if i % 13 == 5 else 1 + i % 4

    return pa.table({"input_ids": pa.array([[i] * length(i) for i in range(num_rows)], type=pa.list_(pa.int32()))})


def take(stream: Iterable[dict], count: int) -> list[dict]:
    """The next ``count`` samples of a fresh iterator over ``stream``."""
    iterator = iter(stream)
    return [next(iterator) for _ in range(count)]


def rows_of(samples: list[dict]) -> list[int]:
    """Each sample's row, read from its first token (see :func:`table`)."""
    return [int(s["input_ids"][0]) for s in samples]


def described(samples: list[dict]) -> list[tuple]:
    """What identifies each sample: row, pass, tokens and what the length policy did to it."""
    return [
        (s["source_row"], s["epoch"], s["input_ids"].tolist(), s.get("truncated_tokens"), s.get("dropped_before"))
        for s in samples
    ]
