"""DocumentBlock: a block's documents by reference (rows, lengths, token positions) and what it skipped."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_tune_data.sources.arrow import ArrowSource
from lightning_tune_data.sources.arrow_columns import ListColumn
from lightning_tune_data.sources.document_block import DocumentBlock

from source_tables import gappy_table, table


def test_references_are_the_packers_piece_tuples_in_document_order():
    block = DocumentBlock("web", 3, [10, 20], [4, 2], [7, 9], [1, 0], [0, 2], {}, np.array([5, 2]), np.array([0, 1]), None)
    assert block.references() == [("web", 7, 3, 0, 4, True, 1, 0), ("web", 9, 3, 0, 2, True, 0, 2)]
    assert block.stores == {}


@pytest.mark.parametrize("flat", [True, False])
def test_input_ids_are_zero_copy_views_whether_the_block_holds_positions_or_views(flat, monkeypatch):
    if not flat:
        monkeypatch.setattr(ListColumn, "flat", lambda self: None)
    source = ArrowSource(table(30), "src", seed=2, max_seq_len=4)
    block = source.read_block(12)
    assert block.stores == ({"src": source} if flat else {})
    assert all(type(tokens) is int for tokens in block.tokens) == flat
    expected = [[row] * min(1 + row % 7, 4) for row in block.rows]
    assert [ids.tolist() for ids in block.input_ids] == expected
    assert all(not ids.flags.owndata for ids in block.input_ids)


def test_skipped_through_counts_the_empty_and_overlong_rows_among_the_first_rows_read():
    data = gappy_table(40)
    lengths = [len(row) for row in data.column("input_ids").to_pylist()]
    block = ArrowSource(data, "src", shuffle=False, max_seq_len=5, overlong="drop").read_block(40)
    assert block.read_lengths.tolist() == lengths
    for read in (1, 4, 18, 40):
        assert block.skipped_through(read, 5) == (lengths[:read].count(0), sum(n > 5 for n in lengths[:read]))
    assert block.kept.tolist() == [i for i, n in enumerate(lengths) if 0 < n <= 5]
