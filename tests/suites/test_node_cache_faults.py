"""The node's shard cache under faults: what the disk really holds, killed and stopped holders,
a small full filesystem, and a flaky network, with real processes of one node.

* The disk check counts allocated blocks under ``local_cache_dir``, with the files that were
  deleted but are still mapped or open by any process (found through ``/proc/<pid>/maps`` and
  ``/proc/<pid>/fd``, see ``cache.sizes.allocated_size``): what a full disk would see, not what
  the cache believes.
* Storage is moto's S3 server on 127.0.0.1, through the fault-injecting proxy.
* The small filesystem is a size-limited tmpfs mounted for the test; where mounting is not
  permitted, ``/dev/full`` (every write fails with ENOSPC) stands in for it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import xxhash

from lightning_tune_data.cache import node_cache, shard_fetch
from lightning_tune_data.cache.cached_store import CachedStore
from lightning_tune_data.cache.window_plan import check_window
from lightning_tune_data.cache.local_disk import check_shard_cache_disk
from lightning_tune_data.cache.node_cache import NODE_CACHE_FOLDER, NodeShardCache
from lightning_tune_data.cache.owners import LockWaitTimeout
from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.cache.shard_fetch import FetchRetries, LocalDiskFullError
from lightning_tune_data.cache.sizes import allocated_size
from lightning_tune_data.cache.store_files import StoreFiles
from lightning_tune_data.sources.arrow import ArrowSource

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from fault_proxy import Fault, partials, put_random_shards, storage_options  # noqa: E402

FORK = multiprocessing.get_context("fork")
STORE = "src-0123456789abcdef"
BLOCK = 4096


# -- what the disk holds ----------------------------------------------------------------------------
def local_token_store(root: Path, shards: int, rows_per_shard: int, tokens: int) -> tuple[StoreFiles, dict]:
    """A committed store of ``shards`` Arrow shards (``input_ids`` rows of ``tokens`` tokens) on
    this machine, read as a remote one: its files and its commit."""
    name = "docs-00112233445566778899"
    folder = root / name
    rng = np.random.default_rng(0)
    entries, files = [], {}
    for number in range(shards):
        values = rng.integers(0, 50_000, size=rows_per_shard * tokens, dtype=np.int32)
        column = pa.ListArray.from_arrays(np.arange(0, len(values) + 1, tokens, dtype=np.int32), values)
        table = pa.table({"input_ids": column})
        path = f"shards/task-00000-of-00001/{number:05d}.arrow"
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        with pa.OSFile(str(folder / path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        data = (folder / path).read_bytes()
        entries.append({"path": path, "rows": rows_per_shard, "tokens": rows_per_shard * tokens})
        files[path] = {"size": len(data), "xxh3_128": xxhash.xxh3_128(data).hexdigest()}
    content = {"store": {"shards": entries, "columns": ["input_ids"]}, "files": files}
    return StoreFiles(StoreRoot(str(root)), name), content


def _read_a_pass(store: CachedStore, rank: int, world: int, results) -> None:  # noqa: ANN001
    try:
        held = []
        count = 0
        for document in ArrowSource(store, "docs", seed=5, rank=rank, world_size=world, num_passes=1):
            held = (held + [np.array(document["input_ids"])])[-2:]  # a packer's copies of held documents
            count += 1
        results.put(count)
    except BaseException as error:  # noqa: BLE001 - reported to the test
        results.put(f"{type(error).__name__}: {error}")


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("readers", "windows"), [(1, 2), (3, 3)])
def test_the_disk_never_holds_more_than_the_budget_and_a_shard_per_reader_counting_files_still_mapped(tmp_path, monkeypatch,
                                                                                           readers, windows):
    monkeypatch.setattr(node_cache, "ROOM_WAIT_S", 0.5)  # readers a window apart wait for each other: briefly here
    monkeypatch.setattr(node_cache, "LOCK_WAIT_S", 30.0)
    files, content = local_token_store(tmp_path / "storage", shards=24, rows_per_shard=16, tokens=1024)
    sizes = [entry["size"] for entry in content["files"].values()]
    budget = windows * 2 * max(sizes)  # windows of 2 shards: a reader holds its window and the next
    order = {"block_rows": 16, "window_blocks": 2}  # blocks of one shard's rows
    check_window([16] * 24, sizes[:24], budget, order, "docs")
    node = tmp_path / "node" / NODE_CACHE_FOLDER
    store = CachedStore(files, content, node, budget, order, "source 'docs'")
    worst, stop = [0, 0], threading.Event()

    def watch() -> None:
        while not stop.is_set():
            used, count = allocated_size(node)
            if used - count * BLOCK > worst[0] - worst[1] * BLOCK:
                worst[:] = [used, count]
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    results = FORK.Queue()
    processes = [FORK.Process(target=_read_a_pass, args=(store, rank, readers, results)) for rank in range(readers)]
    try:
        for process in processes:
            process.start()
        counts = [results.get(timeout=240) for _ in processes]
        for process in processes:
            process.join(30)
    finally:
        stop.set()
        watcher.join()
    assert all(isinstance(count, int) for count in counts), counts
    assert sum(counts) == 24 * 16 - (24 * 16) % readers
    used, count = worst
    # readers of windows that together outgrow the budget wait for each other, then go over by one shard
    # each while all run (a reader slowed by the machine's load past the short wait here does too):
    # never more than one shard per reader, however long the pass
    assert used <= budget + readers * max(sizes) + count * BLOCK, (used, count, budget, max(sizes))
    assert used > budget // 2  # the readers did fill the cache
    assert not [path for path in node.rglob("*") if ".partial-" in path.name]


# -- killed and stopped holders ----------------------------------------------------------------------
def remote_cache(s3, proxy, node: Path, entries: list[dict], budget: int) -> NodeShardCache:
    files = StoreFiles(StoreRoot(s3.url, storage_options(proxy.url)), STORE)
    return NodeShardCache(files, node, entries, budget, FetchRetries(max_retries=2, backoff_s=0.01), "source 'a'")


def _acquire(cache: NodeShardCache, shard: int, started) -> None:  # noqa: ANN001
    started.set()
    cache.acquire(shard)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
def test_a_reader_waiting_for_a_killed_or_stopped_downloader_goes_on_or_names_it_within_a_bounded_wait(
        s3, fault_proxy, tmp_path, monkeypatch, fault):
    monkeypatch.setattr(shard_fetch, "RANGE_BYTES", 32 << 10)
    monkeypatch.setattr(node_cache, "LOCK_WAIT_S", 1.5)
    entries, [data] = put_random_shards(s3, STORE, [1 << 20])
    fault_proxy.add(Fault(entries[0]["path"], "slow", times=None, piece=8 << 10, delay_s=0.02))
    cache = remote_cache(s3, fault_proxy, tmp_path / "node", entries, budget=4 << 20)
    started = FORK.Event()
    downloader = FORK.Process(target=_acquire, args=(cache, 0, started))
    downloader.start()
    assert started.wait(30)
    deadline = time.monotonic() + 30
    while not [p for p in partials(tmp_path / "node") if p.stat().st_size > 64 << 10]:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(downloader.pid, getattr(signal, fault))
    try:
        began = time.monotonic()
        if fault == "SIGKILL":
            downloader.join(30)
            fault_proxy.faults.clear()
            assert cache.acquire(0).read_bytes() == data  # its lock went with it: downloaded again, verified
            assert not partials(tmp_path / "node")
        else:
            with pytest.raises(LockWaitTimeout, match=rf"download of .*process {downloader.pid} \(T \(stopped\)"):
                cache.acquire(0)
            assert time.monotonic() - began < 15  # bounded: no hang
    finally:
        if fault == "SIGSTOP":
            os.kill(downloader.pid, signal.SIGKILL)
            downloader.join(30)


def _pin(cache: NodeShardCache, shards: list[int], ready) -> None:  # noqa: ANN001
    for shard in shards:
        cache.acquire(shard)
    ready.set()
    time.sleep(120)


@contextlib.contextmanager
def _reader_holding_the_whole_budget(s3, fault_proxy, tmp_path, monkeypatch):  # noqa: ANN001, ANN202
    """A cache of four 10 KB shards under a 20 KB budget, short waits, and a forked reader pinning
    shards 0 and 1 (every byte of the budget): yields ``(cache, blobs, holder)``, kills it after."""
    monkeypatch.setattr(node_cache, "ROOM_WAIT_S", 0.3)
    monkeypatch.setattr(node_cache, "LOCK_WAIT_S", 1.0)
    entries, blobs = put_random_shards(s3, STORE, [10_000] * 4)
    cache = remote_cache(s3, fault_proxy, tmp_path / "node", entries, budget=20_000)
    ready = FORK.Event()
    holder = FORK.Process(target=_pin, args=(cache, [0, 1], ready))
    holder.start()
    try:
        assert ready.wait(30)
        yield cache, blobs, holder
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(30)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_readers_stuck_behind_a_stopped_process_that_pins_every_shard_go_over_by_one_shard_then_fail_naming_it(
        s3, fault_proxy, tmp_path, monkeypatch):
    with _reader_holding_the_whole_budget(s3, fault_proxy, tmp_path, monkeypatch) as (cache, blobs, holder):
        os.kill(holder.pid, signal.SIGSTOP)
        with pytest.warns(UserWarning, match="goes over its budget by one shard"):
            assert cache.acquire(2).read_bytes() == blobs[2]
        assert cache.node_usage() == 30_000  # the budget and one shard, never more
        began = time.monotonic()
        with pytest.raises(LockWaitTimeout, match=rf"waited .* for 10.0 KB of room .*process {holder.pid} \(2 shards, 20.0 KB\).*a stopped one among them.*raise cache_budget"):
            cache.acquire(3)
        assert time.monotonic() - began < 10 and cache.node_usage() == 30_000


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_readers_that_pin_every_shard_and_keep_running_go_over_the_budget_instead_of_waiting_for_each_other(
        s3, fault_proxy, tmp_path, monkeypatch):
    with _reader_holding_the_whole_budget(s3, fault_proxy, tmp_path, monkeypatch) as (cache, blobs, _):
        with pytest.warns(UserWarning, match="goes over its budget by one shard"):
            assert cache.acquire(2).read_bytes() == blobs[2]
        assert cache.acquire(3).read_bytes() == blobs[3], "a second shard while over: no error, no deadlock"
        assert cache.node_usage() == 40_000


# -- a small full filesystem ---------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 256 KB filesystem (a tmpfs mounted for the test), or ``None`` where mounting is not permitted."""
    mount = tmp_path / "small"
    mount.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], capture_output=True)
    except OSError:  # no mount command
        done = None
    if done is None or done.returncode != 0:
        yield None
        return
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.mark.timeout(120)
def test_a_full_small_disk_is_named_and_leaves_nothing_half_written(s3, fault_proxy, tmp_path, small_disk):
    entries, blobs = put_random_shards(s3, STORE, [100_000, 100_000, 120_000])
    if small_disk is None:  # no mount allowed here: every write to the shard's download goes to /dev/full
        node = tmp_path / "node"
        cache = remote_cache(s3, fault_proxy, node, entries, budget=1 << 20)
        import builtins

        real = builtins.open

        def full_open(path, mode="r", *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
            return real("/dev/full", mode, *args, **kwargs) if "partial" in str(path) else real(path, mode, *args, **kwargs)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(shard_fetch, "open", full_open, raising=False)
            with pytest.raises(LocalDiskFullError, match=r"The local cache disk is full"):
                cache.acquire(0)
    else:
        node = small_disk / NODE_CACHE_FOLDER
        with pytest.raises(ValueError, match=rf"cache_budget 1.0 MB is more than the disk of local_cache_dir {node}"):
            check_shard_cache_disk(node, 1 << 20, 0, "source 'a'")  # setup compares the budget with the free space
        (small_disk / "other-data").write_bytes(b"\0" * (100 << 10))  # another program fills part of the disk
        cache = remote_cache(s3, fault_proxy, node, entries, budget=1 << 20)  # a budget the disk no longer holds
        assert cache.acquire(0).read_bytes() == blobs[0]
        with pytest.raises(LocalDiskFullError, match=rf"The local cache disk is full: no room for a .* shard in {node}"):
            cache.acquire(2)
        assert cache.path(0).read_bytes() == blobs[0] and not cache.path(2).exists()
    assert not partials(node)
    assert cache.node_usage() == (100_000 if small_disk is not None else 0)


# -- a flaky network -----------------------------------------------------------------------------------
def _read_all(cache: NodeShardCache, results) -> None:  # noqa: ANN001
    digests = []
    for shard in range(len(cache.shards)):
        digests.append(xxhash.xxh3_128(cache.acquire(shard).read_bytes()).hexdigest())
        cache.release(shard)
    results.put(digests)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_readers_through_dropped_connections_and_503s_within_a_tight_budget_read_verified_bytes(
        s3, fault_proxy, tmp_path):
    entries, _ = put_random_shards(s3, STORE, [30_000] * 6)
    fault_proxy.add(Fault("/" + STORE + "/", "drop", times=4))
    fault_proxy.add(Fault("/" + STORE + "/", "503", times=4))
    cache = remote_cache(s3, fault_proxy, tmp_path / "node", entries, budget=3 * 30_000)
    results = FORK.Queue()
    readers = [FORK.Process(target=_read_all, args=(cache, results)) for _ in range(2)]
    for reader in readers:
        reader.start()
    got = [results.get(timeout=90) for _ in readers]
    for reader in readers:
        reader.join(30)
    assert got[0] == got[1] == [entry["xxh3_128"] for entry in entries]
    assert cache.node_usage() <= 3 * 30_000 and not partials(tmp_path / "node")
