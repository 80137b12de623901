"""write_rows: a batch's rows from packs, one byte join of token positions or a concatenation of views."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from lightning_tune_data.packing import pieces as pack_pieces
from lightning_tune_data.packing import rows as pack_rows
from lightning_tune_data.packing.pack import Pack
from lightning_tune_data.packing.packer import IterablePackedDataset
from lightning_tune_data.packing.pieces import reference
from lightning_tune_data.packing.rows import write_rows
from lightning_tune_data.sources.arrow import ArrowSource
from packing_helpers import STRATEGIES, token_table


def _packs_of(source: ArrowSource, count: int, strategy: str = "best_fit", max_seq_len: int = 64) -> list:
    packer = IterablePackedDataset(source, max_seq_len, strategy=strategy, buffer_size=4)
    it = iter(packer)
    return [next(it).pack for _ in range(count)]


def _expected_rows(packs: list, width: int, pad_id: int) -> np.ndarray:
    rows = np.full((len(packs), width), pad_id, dtype=np.int64)
    for row, pack in enumerate(packs):
        tokens = np.concatenate(pack_pieces.token_arrays(pack.refs, pack.tokens, pack.stores))
        rows[row, : len(tokens)] = tokens
    return rows


def _write(packs: list, width: int, pad_id: int) -> np.ndarray:
    out = np.empty((len(packs), width), dtype=np.int64)
    write_rows(packs, width, pad_id, out.reshape(-1))
    return out


@pytest.mark.parametrize("value_type", [pa.int32(), pa.uint16(), pa.int64()])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_rows_of_token_positions_are_one_byte_join_equal_to_the_documents_tokens(value_type, strategy,
                                                                               monkeypatch) -> None:
    table = token_table(300, seed=5, empty_every=11).cast(pa.schema([("input_ids", pa.list_(value_type))]))
    packs = _packs_of(ArrowSource(table, "s", seed=3, max_seq_len=64), 40, strategy)
    want = _expected_rows(packs, 72, pad_id=7)
    monkeypatch.setattr(pack_rows, "token_arrays", _fail)  # the byte join needs no per-piece view
    for start in range(0, 40, 8):
        np.testing.assert_array_equal(_write(packs[start : start + 8], 72, 7), want[start : start + 8])


def _fail(*args, **kwargs):
    raise AssertionError("the rows were built from per-piece views")


def test_rows_fall_back_to_views_when_sources_differ_in_dtype_or_cannot_hold_the_pad_id() -> None:
    wide = ArrowSource(token_table(200, seed=1), "wide", seed=1, max_seq_len=64)
    narrow_table = token_table(200, seed=2).cast(pa.schema([("input_ids", pa.list_(pa.uint16()))]))
    narrow = ArrowSource(narrow_table, "narrow", seed=1, max_seq_len=64)
    mixed = _packs_of(wide, 3) + _packs_of(narrow, 3)
    np.testing.assert_array_equal(_write(mixed, 64, 5), _expected_rows(mixed, 64, 5))
    packs = _packs_of(narrow, 6)
    np.testing.assert_array_equal(_write(packs, 64, 70_000), _expected_rows(packs, 64, 70_000))


def test_rows_fall_back_to_views_when_a_piece_holds_its_tokens() -> None:
    packs = _packs_of(ArrowSource(token_table(200, seed=6), "s", seed=1, max_seq_len=64), 4)
    held = Pack(packs[0].stores)
    held.add(("s", -1, 0, 0, 3, True, 0, 0), np.array([11, 12, 13], dtype=np.int64))
    for ref, position in zip(packs[1].refs, packs[1].tokens):
        held.add(ref, position)
    group = [packs[0], held, packs[2]]
    np.testing.assert_array_equal(_write(group, 70, 1), _expected_rows(group, 70, 1))


def test_rows_of_pieces_that_hold_their_tokens_are_padded_after_each_pack():
    first, second = Pack(), Pack()
    first.add(reference("m", None, 0, 3), np.array([7, 8, 9]))
    first.add(reference("m", None, 0, 2), np.array([1, 2]))
    second.add(reference("m", None, 0, 4), np.array([4, 5, 6, 7]))
    out = np.empty(2 * 6, dtype=np.int64)
    write_rows([first, second], 6, -1, out)
    assert out.reshape(2, 6).tolist() == [[7, 8, 9, 1, 2, -1], [4, 5, 6, 7, -1, -1]]
