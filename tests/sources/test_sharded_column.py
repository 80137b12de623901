"""Reading a store shard by shard through the node cache, and what a reader keeps as it walks windows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from local_stores import cached, committed_store

from lightning_tune_data.keys import SHARD_BITS
from lightning_tune_data.sources.sharded_column import ShardedColumn, WindowReads
from lightning_tune_data.sources.windowed_order import WindowedPermutation

pytestmark = pytest.mark.filterwarnings("ignore:Train source .* longer than max_seq_len")


@pytest.fixture(scope="module")
def local_store(tmp_path_factory) -> tuple[Path, list[list[int]]]:
    """A committed store of 120 documents in 1 KB shards, and its rows as written."""
    return committed_store(tmp_path_factory.mktemp("store"), 120, seed=3)


def test_rows_read_shard_by_shard_equal_the_stored_rows(local_store, tmp_path):
    folder, rows = local_store
    store = cached(folder, tmp_path)
    column = ShardedColumn(store, "input_ids", "docs")
    assert store.num_shards > 4 and len(column) == len(rows)
    order = np.random.default_rng(0).permutation(len(rows))
    assert [list(view) for view in column.rows(order)] == [rows[i] for i in order]
    views, lengths = column.rows_and_lengths(order[:10])
    assert lengths.tolist() == [len(rows[i]) for i in order[:10]]
    assert list(column.row(int(order[0]))) == rows[order[0]]
    positions, lengths = column.flat().positions(order)  # shard-tagged positions, as a packer keeps them
    tokens = column.flat().values
    assert [list(tokens[p : p + n]) for p, n in zip(positions.tolist(), lengths.tolist())] == [rows[i] for i in order]


def test_a_column_opens_only_the_shards_its_rows_are_in(local_store, tmp_path):
    folder, rows = local_store
    store = cached(folder, tmp_path)
    column = ShardedColumn(store, "input_ids", "docs")
    column.rows(np.arange(int(store.shard_starts[1])))  # the first shard's rows
    assert store.pinned() == [0]
    assert [p.name for p in store.cache.folder.rglob("*.arrow")] == [store.cache.path(0).name]
    assert store.cache.path(0).name.startswith("00000.")


def test_a_missing_column_names_the_shard_and_the_fix(local_store, tmp_path):
    folder, _ = local_store
    column = ShardedColumn(cached(folder, tmp_path), "loss_mask", "docs")
    with pytest.raises(KeyError, match="a shard of the store has no 'loss_mask' column"):
        column.row(0)


def test_entering_a_window_keeps_this_and_the_next_windows_shards_and_lets_go_of_the_rest(local_store, tmp_path):
    folder, rows = local_store
    store = cached(folder, tmp_path, window=2, block_rows=8)
    column = ShardedColumn(store, "input_ids", "docs")
    order = WindowedPermutation(len(rows), 8, 2, key=1)
    reads = WindowReads(store, lambda epoch: order, [column])
    first_window = np.arange(order.window_starts[0], order.window_starts[1])
    assert reads.moved_to(0, np.arange(len(rows))) == len(first_window)  # a read stops at the window's end
    column.rows(order(first_window))
    assert set(store.pinned()) == set(reads.shards_of_window(order, 0))
    assert set(reads.shards_of_window(order, 0)) == set(store.shard_of(order(first_window)).tolist())
    second = order.window_starts[2]
    reads.moved_to(0, np.arange(second, len(rows)))  # window 2: windows 0 and 1 are let go of
    kept = set(reads.shards_of_window(order, 2)) | set(reads.shards_of_window(order, 3))
    passed = set(reads.shards_of_window(order, 0)) - kept
    assert passed and not set(store.pinned()) & passed
    distance = store.cache._next_use()  # noqa: SLF001 - what the cache was told about the next uses
    upcoming = set(reads.shards_of_window(order, 3)) - set(reads.shards_of_window(order, 2))
    assert all(distance(shard) == 1 for shard in upcoming)
    later = [shard for shard in passed
             if not any(shard in reads.shards_of_window(order, w) for w in range(2, order.num_windows))]
    assert all(distance(shard) > 1 for shard in later)  # a shard passed for good is needed next pass


def _walk_to_window_2(folder, rows, tmp_path, taking: bool):
    store = cached(folder, tmp_path, window=2, block_rows=8)
    column = ShardedColumn(store, "input_ids", "docs")
    order = WindowedPermutation(len(rows), 8, 2, key=1)
    reads = WindowReads(store, lambda epoch: order, [column])
    if taking:
        reads.take_released()  # a packer takes what was let go of (nothing yet)
    reads.moved_to(0, np.arange(len(rows)))
    column.rows(order(np.arange(order.window_starts[0], order.window_starts[1])))
    reads.moved_to(0, np.arange(order.window_starts[2], len(rows)))
    kept = set(reads.shards_of_window(order, 2)) | set(reads.shards_of_window(order, 3))
    passed = sorted(set(reads.shards_of_window(order, 0)) - kept)
    return store, reads, passed, order


def test_shards_let_go_of_stay_until_a_packer_has_copied_out_what_it_holds_of_them(local_store, tmp_path):
    """A packer copies out the documents it holds of shards let go of after the reader moved on:
    until it has, they must stay on the node (else it fetches each again, a pass downloading the
    store several times over); once it has, nothing of them may stay (an idle reader would hold
    room the node's other readers wait for)."""
    from lightning_tune_data.cache.node_room import evict

    folder, rows = local_store
    store, reads, passed, order = _walk_to_window_2(folder, rows, tmp_path / "packer", taking=True)
    assert passed and not set(store.pinned()) & set(passed)
    assert not any(evict(store.cache.path(shard)) for shard in passed)  # still mapped
    assert reads.take_released() == set(passed)
    assert not any(evict(store.cache.path(shard)) for shard in passed)  # the packer copies them out now
    column = reads._columns[0]
    column.flat().values[int(passed[0]) << SHARD_BITS : (int(passed[0]) << SHARD_BITS) + 1]  # a copy's read
    reads.copied_out()
    assert all(evict(store.cache.path(shard)) for shard in passed)  # then they go, views included
    store, reads, passed, _ = _walk_to_window_2(folder, rows, tmp_path / "room", taking=True)
    store.cache.on_room_needed()  # the node's cache needs room
    assert all(evict(store.cache.path(shard)) for shard in passed)


def test_a_reader_that_does_not_take_what_it_let_go_of_keeps_nothing(local_store, tmp_path):
    from lightning_tune_data.cache.node_room import evict

    folder, rows = local_store
    store, _, passed, _ = _walk_to_window_2(folder, rows, tmp_path, taking=False)
    assert passed and all(evict(store.cache.path(shard)) for shard in passed)
