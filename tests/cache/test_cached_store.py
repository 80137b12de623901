"""``CachedStore`` over a store written and committed to a real S3 API (moto's server) by the
package's own task writer, read through s3fs and a counting proxy; what it says it will do, and
which saved orders a resume may adopt."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from lightning_tune_data.cache.cached_store import CachedStore
from lightning_tune_data.cache.mirror import publish_task
from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.cache.store_files import StoreFiles
from lightning_tune_data.cache.tasks import commit_store, write_task

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from fault_proxy import storage_options  # noqa: E402

STORE = "src-0f1e2d3c4b5a6978"
FINGERPRINT = "0f1e2d3c4b5a6978" * 4
ROWS = 600


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
    return CachedStore(files, content, tmp_path / "node" / STORE, budget, {"block_rows": 40, "window_blocks": 1},
                       "train/a")


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
    assert f"{ROWS} rows in {len(shards)} shards" in repr(store) and "window=40 rows" in repr(store)
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


def test_a_shard_closed_with_keep_mapped_stays_mapped_until_let_go_of_then_can_be_evicted(s3, fault_proxy, tmp_path,
                                                                                           committed):
    from lightning_tune_data.cache.node_room import evict

    content, _ = committed
    store = cached_store(s3, fault_proxy, tmp_path, content, budget=10 << 20)
    store.open_shard(1)
    store.close_shard(1, keep_mapped=True)  # a packer copies out what it holds of it first
    assert store.pinned() == [] and not evict(store.cache.path(1))
    store.open_shard(1, pin=False)  # read again from the kept mapping: nothing is mapped anew
    assert not evict(store.cache.path(1))
    store.let_go_kept()
    assert evict(store.cache.path(1))


def test_every_row_read_through_a_budget_of_two_shards_matches_the_store_and_usage_stays_within_it(
        s3, fault_proxy, tmp_path, committed):
    content, table = committed
    sizes = [content["files"][shard["path"]]["size"] for shard in content["store"]["shards"]]
    budget = 2 * max(sizes)
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


def test_the_plan_line_names_the_budget_the_window_the_shards_and_the_downloads_per_pass(s3, fault_proxy, tmp_path,
                                                                                         committed):
    content, _ = committed
    store = cached_store(s3, fault_proxy, tmp_path, content, budget=10 << 20)
    line = store.describe_plan()
    assert f"{store.num_shards} shards, {ROWS} rows" in line
    assert "cache_budget 10.5 MB" in line and "shuffle window of 40 rows (1 block of 40 rows)" in line
    assert "downloads per pass at most" in line and "\n" not in line


def test_a_resume_adopts_a_saved_window_the_budget_holds_and_refuses_one_it_cannot_naming_the_size(
        s3, fault_proxy, tmp_path, committed):
    content, _ = committed
    sizes = [content["files"][shard["path"]]["size"] for shard in content["store"]["shards"]]
    store = cached_store(s3, fault_proxy, tmp_path, content, budget=4 * max(sizes))
    assert sum(sizes) > 4 * max(sizes)
    store.adopt_order({"block_rows": 20, "window_blocks": 1})
    assert store.order == {"block_rows": 20, "window_blocks": 1} and store.window == 20
    with pytest.raises(ValueError, match=r"train/a: cache_budget .* cannot hold a shuffle window of 600 rows .*"
                                         r"Raise cache_budget to at least .*resume_data_state: false"):
        store.adopt_order({"block_rows": 300, "window_blocks": 2})
    assert store.window == 20  # unchanged
    with pytest.raises(ValueError, match=r"train/a: the checkpoint was written reading the whole store .* full shuffle"):
        store.adopt_order(None)
