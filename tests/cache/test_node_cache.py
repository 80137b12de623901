"""The node's bounded shard cache, against a real S3 API (moto's server) through s3fs and a
fault-injecting proxy, with real processes (forked) standing for the ranks of one node: each
shard downloaded once, usage within the budget, pinned shards kept, eviction furthest-next-use
first, and a download killed half-way never trusted."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import xxhash

from lightning_tune_data.cache import node_cache, shard_fetch
from lightning_tune_data.cache.node_cache import NodeShardCache
from lightning_tune_data.cache.node_room import evict
from lightning_tune_data.cache.reader_positions import ReaderPositions
from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.cache.shard_fetch import FetchRetries, ShardCorruptError
from lightning_tune_data.cache.store_files import StoreFiles

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from fault_proxy import Fault, alive, partials, put_random_shards, storage_options  # noqa: E402

STORE = "src-8899aabbccddeeff"
FORK = multiprocessing.get_context("fork")  # a rank of the node: a process of its own, started fast


def node_cache_of(s3, proxy, folder: Path, entries: list[dict], budget: int) -> NodeShardCache:
    files = StoreFiles(StoreRoot(s3.url, storage_options(proxy.url)), STORE)
    return NodeShardCache(files, folder, entries, budget, FetchRetries(max_retries=2, backoff_s=0.01), "train/a")


def digest(path: Path) -> str:
    return xxhash.xxh3_128(path.read_bytes()).hexdigest()


def run_ranks(target, *per_rank_args) -> list:
    """Run ``target(*args, results)`` in one forked process per rank; every rank's result."""
    results = FORK.Queue()
    processes = [FORK.Process(target=_reporting, args=(target, args, results)) for args in per_rank_args]
    for process in processes:
        process.start()
    got = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(timeout=30)
    errors = [item for item in got if isinstance(item, str)]
    assert not errors, errors
    assert all(process.exitcode == 0 for process in processes)
    return got


def _reporting(target, args, results) -> None:
    try:
        results.put(target(*args))
    except BaseException as error:  # noqa: BLE001 - reported to the test
        results.put(f"{type(error).__name__}: {error}")
        raise


def _read_in_order(cache: NodeShardCache, order: list[int], start) -> tuple[list[str], int]:
    start.wait(timeout=30)
    digests = []
    for shard in order:
        digests.append(digest(cache.acquire(shard)))
        cache.release(shard)
    return digests, cache.downloaded_bytes


def _read_within_budget(cache: NodeShardCache, order: list[int], start) -> int:
    """Read ``order`` one shard pinned at a time, the next one prefetched; the most usage seen."""
    start.wait(timeout=30)
    worst = 0
    for position, shard in enumerate(order):
        cache.acquire(shard)
        worst = max(worst, cache.node_usage())
        cache.prefetch(order[position + 1: position + 2])
        cache.release(shard)
    return worst


# -- several processes on one node ------------------------------------------------------------------
def test_two_ranks_acquiring_the_same_shards_at_once_download_each_once_and_read_identical_bytes(
        s3, fault_proxy, tmp_path):
    entries, blobs = put_random_shards(s3, STORE, [40_000, 60_000, 50_000, 30_000])
    fault_proxy.add(Fault("/" + STORE + "/", "slow", times=None, piece=4096, delay_s=0.005))  # downloads overlap
    cache = node_cache_of(s3, fault_proxy, tmp_path / "node", entries, budget=10 << 20)
    start = FORK.Barrier(2)

    (first, got_first), (second, got_second) = run_ranks(_read_in_order, (cache, [0, 1, 2, 3], start),
                                                         (cache, [0, 1, 2, 3], start))

    expected = [entry["xxh3_128"] for entry in entries]
    assert first == second == expected
    assert [fault_proxy.gets(entry["path"]) for entry in entries] == [1, 1, 1, 1]
    assert got_first + got_second == sum(len(blob) for blob in blobs)  # every byte downloaded by one rank only
    assert not partials(tmp_path / "node")


def test_two_ranks_reading_every_shard_through_a_tiny_budget_never_exceed_it(s3, fault_proxy, tmp_path):
    sizes = [20_000, 30_000, 25_000, 20_000, 30_000, 25_000, 28_000, 22_000]
    entries, _ = put_random_shards(s3, STORE, sizes)
    budget = 3 * max(sizes)  # one pinned shard and one prefetched per rank, and one more: eviction is forced
    cache = node_cache_of(s3, fault_proxy, tmp_path / "node", entries, budget)
    start = FORK.Barrier(3)
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        start.wait(timeout=30)
        while not stop.is_set():
            seen.append(cache.node_usage())
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        worst = run_ranks(_read_within_budget, (cache, list(range(8)), start), (cache, list(range(7, -1, -1)), start))
    finally:
        stop.set()
        watcher.join()

    assert max(worst) <= budget and max(seen) <= budget, (worst, max(seen), budget)
    assert sum(fault_proxy.gets(entry["path"]) for entry in entries) > len(entries)  # evicted, then fetched again
    assert cache.node_usage() <= budget


def _hold(cache: NodeShardCache, shards: list[int], held, done) -> None:
    for shard in shards:
        cache.acquire(shard)
    held.set()
    done.wait(timeout=30)


def test_shards_pinned_by_another_rank_are_never_evicted_and_a_reader_needing_room_goes_over_budget_after_the_wait(
        s3, fault_proxy, tmp_path, monkeypatch):
    entries, blobs = put_random_shards(s3, STORE, [10_000] * 4)
    monkeypatch.setattr(node_cache, "ROOM_WAIT_S", 0.5)
    folder = tmp_path / "node"
    cache = node_cache_of(s3, fault_proxy, folder, entries, budget=20_000)
    held, done = FORK.Event(), FORK.Event()
    rank = FORK.Process(target=_hold, args=(cache, [0, 1], held, done))
    rank.start()
    try:
        assert held.wait(timeout=30)
        cache.prefetch([2])  # a prefetch never goes over the budget: nothing is fetched
        time.sleep(0.3)
        assert fault_proxy.gets(entries[2]["path"]) == 0 and not cache.path(2).exists()

        started = time.monotonic()
        with pytest.warns(UserWarning, match=r"goes over its budget .*readers on this node hold every cached shard"):
            path = cache.acquire(3)
        assert time.monotonic() - started >= 0.5
        assert path.read_bytes() == blobs[3]
        assert cache.path(0).read_bytes() == blobs[0] and cache.path(1).read_bytes() == blobs[1]
        assert cache.node_usage() == 30_000
    finally:
        done.set()
        rank.join(timeout=30)
    cache.release(3)  # nobody pins anything now: room is made by eviction again

    cache.acquire(2)
    assert cache.node_usage() <= 20_000
    assert cache.path(2).read_bytes() == blobs[2]


def _download(cache: NodeShardCache) -> None:
    cache.acquire(0)


@pytest.mark.timeout(120)
def test_a_rank_killed_mid_download_leaves_only_a_partial_file_that_a_later_cache_removes_and_downloads_again(
        s3, fault_proxy, tmp_path, monkeypatch):
    monkeypatch.setattr(shard_fetch, "RANGE_BYTES", 64 << 10)
    entries, [data] = put_random_shards(s3, STORE, [1 << 20])
    fault_proxy.add(Fault(entries[0]["path"], "slow", times=None, piece=8 << 10, delay_s=0.03))
    folder = tmp_path / "node"
    cache = node_cache_of(s3, fault_proxy, folder, entries, budget=4 << 20)
    rank = FORK.Process(target=_download, args=(cache,))
    rank.start()
    deadline = time.monotonic() + 30
    while not [p for p in partials(folder) if p.stat().st_size >= 128 << 10] and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(rank.pid, signal.SIGKILL)
    rank.join(timeout=30)
    assert not alive(rank.pid)

    [partial] = partials(folder)
    assert partial.name.startswith(cache.path(0).name + ".partial-")
    assert 0 < partial.stat().st_size < len(data) and data.startswith(partial.read_bytes())
    assert not cache.path(0).exists()
    fault_proxy.faults.clear()

    later = node_cache_of(s3, fault_proxy, folder, entries, budget=4 << 20)
    assert later.node_usage() == 0  # the dead rank's partial is neither a shard nor a download in progress
    assert not partials(folder)
    assert later.acquire(0).read_bytes() == data
    assert fault_proxy.gets(entries[0]["path"], range_start=0) == 2  # fetched again from the start


# -- one process ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("distance", "pinned", "evicted"), [
    ({0: 5.0, 1: float("inf"), 2: 1.0}, None, 1),
    ({0: 9.0, 1: 2.0, 2: 1.0}, None, 0),
    ({0: 9.0, 1: 2.0, 2: 1.0}, 0, 1),  # the furthest is pinned: the next furthest goes
], ids=["never-needed-again", "furthest", "furthest-pinned"])
def test_eviction_removes_the_unpinned_shard_whose_next_use_is_furthest(s3, fault_proxy, tmp_path, distance, pinned,
                                                                         evicted):
    entries, blobs = put_random_shards(s3, STORE, [10_000] * 4)
    cache = node_cache_of(s3, fault_proxy, tmp_path / "node", entries, budget=30_000)
    for shard in range(3):
        cache.acquire(shard)
        if shard != pinned:
            cache.release(shard)
    cache.set_next_use(lambda epoch, window: distance.get, 0, 0)

    cache.acquire(3)

    assert [cache.path(shard).exists() for shard in range(4)] == [shard != evicted for shard in range(4)]
    assert cache.node_usage() == 30_000
    assert all(cache.path(shard).read_bytes() == blobs[shard] for shard in range(4) if shard != evicted)


def _publish_and_wait(folder: str, ready, done) -> None:  # noqa: ANN001
    ReaderPositions(Path(folder)).publish(0, 0)
    ready.set()
    done.wait(30)


def test_eviction_spares_a_shard_another_reader_of_the_node_needs_soon(s3, fault_proxy, tmp_path):
    entries, _ = put_random_shards(s3, STORE, [10_000] * 4)
    cache = node_cache_of(s3, fault_proxy, tmp_path / "node", entries, budget=30_000)
    for shard in range(3):
        cache.acquire(shard)
        cache.release(shard)
    from_window = {0: {0: 0.5, 1: 9.0, 2: 9.0}, 1: {0: 9.0, 1: 2.0, 2: 1.0}}  # distances seen from each window
    context = multiprocessing.get_context("fork")
    ready, done = context.Event(), context.Event()
    other = context.Process(target=_publish_and_wait, args=(str(cache.folder), ready, done))
    other.start()
    try:
        assert ready.wait(30)
        cache.set_next_use(lambda epoch, window: from_window[window].get, 0, 1)  # this reader is at window 1
        cache.acquire(3)
    finally:
        done.set()
        other.join(30)
    # alone, this reader would evict shard 0 (its next use is furthest); the other reader needs it next
    assert [cache.path(shard).exists() for shard in range(4)] == [True, False, True, True]


def test_a_shard_evicted_while_a_reader_waits_to_pin_it_is_downloaded_again(s3, fault_proxy, tmp_path):
    entries, [data] = put_random_shards(s3, STORE, [10_000])
    cache = node_cache_of(s3, fault_proxy, tmp_path / "node", entries, budget=30_000)
    path = cache.acquire(0)
    cache.release(0)
    evictor = os.open(path, os.O_RDONLY)  # an evicting process takes the shard's exclusive lock first
    import fcntl

    fcntl.flock(evictor, fcntl.LOCK_EX)
    pinned: list[Path] = []
    reader = threading.Thread(target=lambda: pinned.append(cache.acquire(0)))
    reader.start()
    deadline = time.monotonic() + 10
    while sum(os.path.realpath(f"/proc/self/fd/{fd}") == str(path) for fd in os.listdir("/proc/self/fd")) < 2:
        assert time.monotonic() < deadline, "the reader never waited for the shard's lock"
        time.sleep(0.01)
    time.sleep(0.05)  # the reader tries the lock and backs off
    path.unlink()  # evicted while the reader waits
    os.close(evictor)
    reader.join(timeout=30)

    assert pinned == [cache.path(0)] and cache.pinned() == [0]
    assert pinned[0].read_bytes() == data
    assert fault_proxy.gets(entries[0]["path"]) == 2


def test_a_shard_removed_after_its_download_is_downloaded_again_when_acquired(s3, fault_proxy, tmp_path):
    entries, [data] = put_random_shards(s3, STORE, [10_000])
    cache = node_cache_of(s3, fault_proxy, tmp_path / "node", entries, budget=30_000)
    cache.acquire(0)
    cache.release(0)
    cache.path(0).unlink()  # evicted by another rank

    assert cache.acquire(0).read_bytes() == data
    assert fault_proxy.gets(entries[0]["path"]) == 2
    assert cache.downloaded_bytes == 2 * len(data)


def test_a_shard_corrupt_in_storage_is_named_and_leaves_nothing_in_the_node_cache(s3, fault_proxy, tmp_path):
    entries, _ = put_random_shards(s3, STORE, [10_000])
    fault_proxy.add(Fault(entries[0]["path"], "corrupt", times=None))
    cache = node_cache_of(s3, fault_proxy, tmp_path / "node", entries, budget=30_000)

    with pytest.raises(ShardCorruptError, match=entries[0]["path"]):
        cache.acquire(0)

    assert not cache.path(0).exists() and not partials(tmp_path / "node")
    assert cache.node_usage() == 0 and cache.pinned() == []
    assert fault_proxy.gets(entries[0]["path"]) == 2


# -- the file the commit names, and nothing else ----------------------------------------------------
def test_a_store_prepared_again_with_other_shards_at_the_same_paths_never_reads_the_old_files_and_evicts_them_first(
        s3, fault_proxy, tmp_path):
    old_entries, _ = put_random_shards(s3, STORE, [10_000, 10_000])
    old = node_cache_of(s3, fault_proxy, tmp_path / "node", old_entries, budget=25_000)
    for shard in (0, 1):
        old.acquire(shard)
        old.release(shard)
    old.close()
    entries, blobs = put_random_shards(s3, STORE, [7_000, 12_000])  # prepared again: same paths, other bytes
    assert [entry["path"] for entry in entries] == [entry["path"] for entry in old_entries]
    new = node_cache_of(s3, fault_proxy, tmp_path / "node", entries, budget=25_000)
    assert new.folder != old.folder
    assert new.node_usage() == 20_000  # the old commit's files count against the node's budget

    assert new.acquire(0).read_bytes() == blobs[0]
    assert new.acquire(1).read_bytes() == blobs[1]

    assert not old.path(0).exists() and not old.path(1).exists()  # no reader names them: they went first
    assert new.node_usage() == 19_000 <= new.budget


def test_the_budget_is_the_nodes_for_every_store_read_there(s3, fault_proxy, tmp_path):
    entries, blobs = put_random_shards(s3, STORE, [10_000] * 3)
    other_entries, _ = put_random_shards(s3, "other-0011223344556677", [10_000] * 3)
    first = node_cache_of(s3, fault_proxy, tmp_path / "node", entries, budget=30_000)
    files = StoreFiles(StoreRoot(s3.url, storage_options(fault_proxy.url)), "other-0011223344556677")
    second = NodeShardCache(files, tmp_path / "node", other_entries, 30_000, FetchRetries(max_retries=2), "train/b")
    for shard in range(3):
        first.acquire(shard)
        second.acquire(shard)  # the second store's shards make room among the first store's (not pinned)
        first.release(shard)
        second.release(shard)
        assert first.node_usage() <= 30_000
    assert second.node_usage() == 30_000


# -- leaks --------------------------------------------------------------------------------------------
def _wait_for(ready, done) -> None:  # noqa: ANN001
    ready.set()
    done.wait(30)


def test_a_shard_pinned_before_a_fork_is_not_kept_pinned_by_the_child(s3, fault_proxy, tmp_path):
    entries, _ = put_random_shards(s3, STORE, [10_000])
    cache = node_cache_of(s3, fault_proxy, tmp_path / "node", entries, budget=30_000)
    path = cache.acquire(0)  # e.g. a batch looked at before the dataloader's workers start
    ready, done = FORK.Event(), FORK.Event()
    worker = FORK.Process(target=_wait_for, args=(ready, done))  # a persistent worker that never reads this store
    worker.start()
    try:
        assert ready.wait(30)
        cache.release(0)
        assert evict(path)  # nobody holds it: the worker closed its inherited copy of the lock at the fork
    finally:
        done.set()
        worker.join(30)


def prefetch_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("shard-prefetch")]


def test_a_cache_garbage_collected_or_closed_stops_its_threads_and_lets_go_of_its_pins(s3, fault_proxy, tmp_path):
    import gc

    entries, _ = put_random_shards(s3, STORE, [10_000] * 3)
    assert not prefetch_threads()
    cache = node_cache_of(s3, fault_proxy, tmp_path / "node", entries, budget=30_000)
    path = cache.acquire(0)
    cache.prefetch([1, 2])
    assert prefetch_threads()
    del cache
    gc.collect()
    deadline = time.monotonic() + 10
    while prefetch_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not prefetch_threads() and evict(path)

    closed = node_cache_of(s3, fault_proxy, tmp_path / "node", entries, budget=30_000)
    path = closed.acquire(1)
    closed.prefetch([2])
    closed.close()
    assert not prefetch_threads() and closed.pinned() == [] and evict(path)


def _prefetch_and_return(cache: NodeShardCache, started) -> None:
    cache.prefetch([0])
    while not partials(cache.folder):
        time.sleep(0.005)
    started.set()  # the process ends (as a dataloader worker does) while the download is in flight


def test_a_process_that_ends_during_a_prefetch_leaves_no_partial_download(s3, fault_proxy, tmp_path, monkeypatch):
    monkeypatch.setattr(shard_fetch, "RANGE_BYTES", 16 << 10)
    entries, _ = put_random_shards(s3, STORE, [512 << 10])
    fault_proxy.add(Fault(entries[0]["path"], "slow", times=None, piece=8 << 10, delay_s=0.02))
    cache = node_cache_of(s3, fault_proxy, tmp_path / "node", entries, budget=4 << 20)
    started = FORK.Event()
    worker = FORK.Process(target=_prefetch_and_return, args=(cache, started))
    worker.start()
    assert started.wait(30)
    worker.join(30)
    assert worker.exitcode == 0
    assert not partials(tmp_path / "node")  # gone with its process, not left for the next reader to find


# -- room -----------------------------------------------------------------------------------------------
def test_going_over_the_budget_under_warnings_as_errors_leaves_no_reservation(s3, fault_proxy, tmp_path, monkeypatch):
    import warnings

    entries, _ = put_random_shards(s3, STORE, [10_000] * 3)
    monkeypatch.setattr(node_cache, "ROOM_WAIT_S", 0.2)
    cache = node_cache_of(s3, fault_proxy, tmp_path / "node", entries, budget=20_000)
    cache.acquire(0)
    cache.acquire(1)  # every byte of the budget is pinned
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PYTHONWARNINGS=error
        with pytest.raises(UserWarning, match="goes over its budget"):
            cache.acquire(2)
    assert cache.node_usage() == 20_000 and not partials(tmp_path / "node")


def test_a_prefetch_never_evicts_a_shard_needed_sooner_than_the_one_it_fetches(s3, fault_proxy, tmp_path):
    entries, _ = put_random_shards(s3, STORE, [10_000] * 4)
    cache = node_cache_of(s3, fault_proxy, tmp_path / "node", entries, budget=30_000)
    for shard in range(3):
        cache.acquire(shard)
        cache.release(shard)
    cache.set_next_use(lambda epoch, window: {0: 1.0, 1: 2.0, 2: 3.0, 3: 5.0}.get, 0, 0)
    assert not cache._ensure(3, must=False)  # every shard present is needed before shard 3
    assert all(cache.path(shard).exists() for shard in range(3)) and not cache.path(3).exists()
    cache.set_next_use(lambda epoch, window: {0: 1.0, 1: 9.0, 2: 3.0, 3: 5.0}.get, 0, 0)
    assert cache._ensure(3, must=False)  # shard 1 is needed after shard 3: it makes room
    assert [cache.path(shard).exists() for shard in range(4)] == [True, False, True, True]
