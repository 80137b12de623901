"""One token address space over a store's shards: positions a packer keeps, slices it joins."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from local_stores import cached, committed_store

from lightning_tune_data.cache.node_room import evict
from lightning_tune_data.keys import SHARD_BITS
from lightning_tune_data.sources.sharded_column import ShardedColumn

pytestmark = pytest.mark.filterwarnings("ignore:Train source .* longer than max_seq_len")


@pytest.fixture(scope="module")
def store_and_rows(tmp_path_factory) -> tuple[Path, list[list[int]]]:
    return committed_store(tmp_path_factory.mktemp("tokens"), 80, seed=5)


def column_of(folder: Path, node: Path) -> ShardedColumn:
    return ShardedColumn(cached(folder, node), "input_ids", "docs")


def test_a_position_names_its_shard_and_slices_give_the_documents_as_arrays_and_as_bytes(store_and_rows, tmp_path):
    folder, rows = store_and_rows
    flat = column_of(folder, tmp_path).flat()
    order = np.random.default_rng(1).permutation(len(rows))
    positions, lengths = flat.positions(order)
    assert (positions >> SHARD_BITS).tolist() == column_of(folder, tmp_path).store.shard_of(order).tolist()
    for row, position, length in zip(order.tolist(), positions.tolist(), lengths.tolist()):
        assert flat.values[position : position + length].tolist() == rows[row]
        assert np.frombuffer(flat.views[position : position + length], dtype=flat.dtype).tolist() == rows[row]
    assert flat.dtype == np.dtype(np.int32) or flat.dtype.kind in "iu"


def test_slicing_a_batch_of_pieces_at_once_equals_slicing_each(store_and_rows, tmp_path):
    folder, rows = store_and_rows
    flat = column_of(folder, tmp_path).flat()
    order = np.random.default_rng(2).permutation(len(rows))
    positions, lengths = flat.positions(order)
    for sliced in (flat.values, flat.views):
        parts = sliced.slices(positions.tolist(), lengths.tolist())
        assert [bytes(part) for part in parts] == [bytes(sliced[p : p + n]) for p, n in zip(positions.tolist(), lengths.tolist())]
    with pytest.raises(TypeError):  # a piece holding its own array is not a position: the caller joins otherwise
        flat.views.slices([np.array([1, 2])], [2])


def test_a_held_position_of_a_shard_let_go_of_keeps_it_from_eviction_only_while_its_views_live(store_and_rows, tmp_path):
    folder, rows = store_and_rows
    column = column_of(folder, tmp_path)
    store, flat = column.store, column.flat()
    (position,), (length,) = flat.positions(np.array([0]))
    held = flat.values[position : position + length]  # a packer still holds the document
    column.keep_only(set())  # the reader moved on: shard 0 is let go of
    store.close_shard(0)
    assert store.pinned() == []
    assert not evict(store.cache.path(0))  # a view is still mapped: no reader of the node can delete the file
    assert held.tolist() == rows[0]
    del held  # the packer copied it out
    assert evict(store.cache.path(0)) and not store.cache.path(0).exists()
    assert flat.views[position : position + length].tobytes() == np.array(rows[0], dtype=flat.dtype).tobytes()
    assert store.cache.path(0).exists() and store.pinned() == []  # fetched again, not pinned
    column.keep_only(set())
    assert evict(store.cache.path(0))
