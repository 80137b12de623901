"""``CachedStore`` over a store written and committed to a real S3 API (moto's server) by the
package's own task writer, read through s3fs and a counting proxy; and how the shuffle window is
derived from the node cache's budget."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from lightning_tune_data.cache.cached_store import CachedStore, shuffle_window_for
from lightning_tune_data.cache.mirror import publish_task
from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.cache.store_files import StoreFiles
from lightning_tune_data.cache.tasks import commit_store, write_task

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from fault_proxy import storage_options  # noqa: E402

STORE = "src-0f1e2d3c4b5a6978"
FINGERPRINT = "0f1e2d3c4b5a6978" * 4
ROWS = 600


# -- the shuffle window -----------------------------------------------------------------------------
@pytest.mark.parametrize(("budget", "window"), [(1200, 2), (500, 1), (10_000, 20), (240, 1)])
def test_the_shuffle_window_is_a_quarter_of_the_largest_shards_the_budget_holds(budget, window):
    sizes = [100] * 19 + [120]
    assert shuffle_window_for(sizes, budget, None, "train/a") == window


def test_an_explicit_shuffle_window_is_kept_when_the_budget_holds_it_and_the_next_one():
    assert shuffle_window_for([100, 120], 720, 3, "train/a") == 3


def test_a_budget_that_cannot_hold_two_windows_is_a_setup_error_saying_how_much_budget_is_needed():
    with pytest.raises(ValueError) as raised:
        shuffle_window_for([100, 120], 700, 3, "train/a")
    assert str(raised.value) == (
        "train/a: cache_budget 700 B cannot hold a shuffle window of 3 shard(s) and the next window fetched ahead "
        "(6 shards of up to 120 B: 720 B). Raise cache_budget to at least 720 B, or lower shuffle_window.")


def test_sizes_that_would_read_alike_are_given_in_bytes():
    with pytest.raises(ValueError, match=r"cache_budget 1,160 bytes .* at least 1,200 bytes"):
        shuffle_window_for([100, 120], 1_160, 5, "train/a")


def test_a_budget_below_two_shards_is_a_setup_error_asking_for_smaller_shards():
    with pytest.raises(ValueError, match=r"cache_budget 239 B cannot hold a shuffle window of 1 shard\(s\).*"
                                         r"it is already 1 shard: the store's shards are large; prepare it with a "
                                         r"smaller shard_size"):
        shuffle_window_for([100, 120], 239, None, "train/a")


def test_a_shuffle_window_below_one_shard_is_rejected():
    with pytest.raises(ValueError, match="train/a: shuffle_window must be >= 1 shard, got 0"):
        shuffle_window_for([100], 1000, 0, "train/a")


# -- a committed store read through the node cache -----------------------------------------------------
@pytest.fixture
def committed(s3, tmp_path) -> tuple[dict, pa.Table]:
    """A store of 600 rows written in several small shards by one task, published to S3 and
    committed: its commit and the rows."""
    lengths = [1 + (row * 7) % 11 for row in range(ROWS)]
    table = pa.table({"input_ids": pa.array([[row] * length for row, length in zip(range(ROWS), lengths)],
                                            pa.list_(pa.int32()))})
    staging = tmp_path / "staging"
    manifest = write_task(staging, table, FINGERPRINT, 0, 1, {"rows": [0, ROWS]}, ROWS, 0, shard_bytes=1500)
    writer = StoreFiles(StoreRoot(s3.url, s3.storage_options), STORE)
    publish_task(staging, writer, manifest)
    content = commit_store(writer, 1, FINGERPRINT, {"fingerprint": FINGERPRINT}, {}, "train/a")
    assert len(content["store"]["shards"]) >= 4
    return content, table


def cached_store(s3, proxy, tmp_path: Path, content: dict, budget: int) -> CachedStore:
    files = StoreFiles(StoreRoot(s3.url, storage_options(proxy.url)), STORE)
    return CachedStore(files, content, tmp_path / "node" / STORE, budget, 1, "train/a")


def test_a_cached_store_knows_its_rows_and_shards_from_the_commit_without_downloading_any(
        s3, fault_proxy, tmp_path, committed):
    content, _ = committed
    shards = content["store"]["shards"]
    store = cached_store(s3, fault_proxy, tmp_path, content, budget=10 << 20)

    assert len(store) == ROWS and store.num_shards == len(shards)
    assert store.shard_rows.tolist() == [shard["rows"] for shard in shards]
    assert store.size == sum(content["files"][shard["path"]]["size"] for shard in shards)
    starts = np.cumsum([0] + [shard["rows"] for shard in shards])
    assert store.shard_of(starts[:-1]).tolist() == list(range(len(shards)))
    assert store.shard_of(starts[1:] - 1).tolist() == list(range(len(shards)))
    assert store.shard_of(np.arange(ROWS)).tolist() == np.repeat(np.arange(len(shards)), store.shard_rows).tolist()
    assert f"{ROWS} rows in {len(shards)} shards" in repr(store) and "window=1" in repr(store)
    assert fault_proxy.gets("/") == 0


def test_open_shard_downloads_only_that_shard_and_keeps_it_pinned_until_closed(s3, fault_proxy, tmp_path, committed):
    content, table = committed
    shards = content["store"]["shards"]
    store = cached_store(s3, fault_proxy, tmp_path, content, budget=10 << 20)
    first, last = int(store.shard_starts[2]), int(store.shard_starts[3])

    opened = store.open_shard(2)

    assert opened.column("input_ids").to_pylist() == table.column("input_ids").to_pylist()[first:last]
    assert [fault_proxy.gets(shard["path"]) for shard in shards] == [0, 0, 1] + [0] * (len(shards) - 3)
    assert store.pinned() == [2]
    store.close_shard(2)
    assert store.pinned() == []
    assert store.open_shard(2).num_rows == last - first
    assert fault_proxy.gets(shards[2]["path"]) == 1  # still on the node: not fetched again


def test_every_row_read_through_a_budget_of_two_shards_matches_the_store_and_usage_stays_within_it(
        s3, fault_proxy, tmp_path, committed):
    content, table = committed
    sizes = [content["files"][shard["path"]]["size"] for shard in content["store"]["shards"]]
    budget = 2 * max(sizes)
    assert shuffle_window_for(sizes, budget, None, "train/a") == 1
    store = cached_store(s3, fault_proxy, tmp_path, content, budget)

    rows, worst = [], 0
    for shard in range(store.num_shards):
        rows += store.open_shard(shard).column("input_ids").to_pylist()
        worst = max(worst, store.cache.node_usage())
        store.close_shard(shard)

    assert rows == table.column("input_ids").to_pylist()
    assert worst <= budget and store.cache.node_usage() <= budget
    assert sum(store.cache.path(shard).exists() for shard in range(store.num_shards)) < store.num_shards  # evicted


def _wait(ready, done) -> None:  # noqa: ANN001
    ready.set()
    done.wait(30)


def test_a_shard_read_before_the_dataloader_forks_is_neither_pinned_nor_mapped_by_its_workers(
        s3, fault_proxy, tmp_path, committed):
    import multiprocessing

    from lightning_tune_data.cache.node_room import evict

    content, _ = committed
    store = cached_store(s3, fault_proxy, tmp_path, content, budget=10 << 20)
    store.open_shard(0)  # a batch looked at before training: shard 0 pinned and mapped
    fork = multiprocessing.get_context("fork")
    ready, done = fork.Event(), fork.Event()
    worker = fork.Process(target=_wait, args=(ready, done))  # a persistent worker of the loader
    worker.start()
    try:
        assert ready.wait(30)
        store.close_shard(0)
        assert evict(store.cache.path(0))  # the worker let go of what it inherited: the shard can go
    finally:
        done.set()
        worker.join(30)
