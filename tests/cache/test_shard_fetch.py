"""Fetching one shard from a real S3 API (moto's server) through s3fs and a proxy that injects
faults: dropped connections and 5xx are retried with backoff from the failing range, then named;
short or damaged bodies are fetched once more, then named; a full local disk says so."""

from __future__ import annotations

import errno
import os
import sys
import time
from pathlib import Path

import pytest

from lightning_tune_data.cache import shard_fetch
from lightning_tune_data.cache.root import StorageError, StoreRoot
from lightning_tune_data.cache.shard_fetch import FetchRetries, LocalDiskFullError, ShardCorruptError, fetch_shard
from lightning_tune_data.cache.store_files import StoreFiles

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from fault_proxy import Fault, put_random_shards, storage_options, without_library_retries  # noqa: E402

STORE = "src-00112233445566ff"
RANGE = 64 << 10
FAST = FetchRetries(max_retries=2, backoff_s=0.01, max_backoff_s=0.05)


@pytest.fixture
def small_ranges(monkeypatch):
    """Ranges of 64 KiB, so a shard of a few hundred KiB is read in several requests."""
    monkeypatch.setattr(shard_fetch, "RANGE_BYTES", RANGE)


def remote(s3, proxy, sizes: list[int]) -> tuple[StoreFiles, list[dict], list[bytes]]:
    """Shards of ``sizes`` bytes in the test's bucket, reached through the fault proxy with the
    library's own retries off."""
    entries, blobs = put_random_shards(s3, STORE, sizes)
    files = without_library_retries(StoreFiles(StoreRoot(s3.url, storage_options(proxy.url)), STORE))
    return files, entries, blobs


def test_a_connection_dropped_mid_range_is_retried_from_that_range_and_the_shard_arrives_verified(
        s3, fault_proxy, small_ranges, tmp_path):
    files, [entry], [data] = remote(s3, fault_proxy, [4 * RANGE])
    fault_proxy.add(Fault(entry["path"], "drop", times=1, range_start=RANGE))
    arrived: list[int] = []
    target = tmp_path / "shard.arrow"

    fetch_shard(files, entry["path"], entry, target, FAST, arrived.append)

    assert target.read_bytes() == data
    assert fault_proxy.gets(entry["path"], range_start=RANGE) == 2  # the dropped range, read again
    assert fault_proxy.gets(entry["path"], range_start=0) == 1  # not from the start
    assert fault_proxy.gets(entry["path"]) == 5
    assert sum(arrived) == len(data)  # progress counts each byte once


def test_a_503_is_retried_with_doubling_backoff_and_the_shard_arrives_verified(s3, fault_proxy, tmp_path):
    files, [entry], [data] = remote(s3, fault_proxy, [50_000])
    fault_proxy.add(Fault(entry["path"], "status", times=2, status=503))
    target = tmp_path / "shard.arrow"

    started = time.monotonic()
    fetch_shard(files, entry["path"], entry, target, FetchRetries(max_retries=3, backoff_s=0.2, max_backoff_s=1.0))

    assert time.monotonic() - started >= 0.2 + 0.4  # waited 0.2 s, then twice that
    assert target.read_bytes() == data
    assert fault_proxy.gets(entry["path"]) == 3


@pytest.mark.parametrize("fault", [Fault("", "drop", times=None), Fault("", "status", times=None, status=503),
                                   Fault("", "status", times=None, status=500)], ids=["dropped", "503", "500"])
def test_a_shard_whose_reads_keep_failing_raises_storage_error_naming_its_url_after_the_bounded_retries(
        s3, fault_proxy, tmp_path, fault):
    files, [entry], _ = remote(s3, fault_proxy, [50_000])
    fault.path_part = entry["path"]
    fault_proxy.add(fault)
    target = tmp_path / "shard.arrow"

    with pytest.raises(StorageError) as raised:
        fetch_shard(files, entry["path"], entry, target, FAST)

    message = str(raised.value)
    assert files.url(entry["path"]) in message and message.startswith("Downloading s3://")
    assert "after 2 retries" in message
    assert fault_proxy.gets(entry["path"]) == 1 + FAST.max_retries
    assert not target.exists()


@pytest.mark.parametrize("action", ["truncate", "corrupt"])
def test_a_short_or_damaged_body_is_fetched_once_more_then_shard_corrupt_error_names_its_url(
        s3, fault_proxy, tmp_path, action):
    files, [entry], _ = remote(s3, fault_proxy, [50_000])
    fault_proxy.add(Fault(entry["path"], action, times=None))
    target = tmp_path / "shard.arrow"

    with pytest.raises(ShardCorruptError) as raised:
        fetch_shard(files, entry["path"], entry, target, FAST)

    message = str(raised.value)
    assert files.url(entry["path"]) in message and "twice" in message
    assert f"--store {files.name})" in message and "--repair" in message and "--all" not in message  # this store only
    assert ("25000 bytes arrived, 50000 were written" if action == "truncate" else "xxh3_128") in message
    assert fault_proxy.gets(entry["path"]) == 2  # downloaded twice, not retried as a network error
    assert not target.exists()


@pytest.mark.parametrize("action", ["truncate", "corrupt"])
def test_a_body_damaged_once_is_fetched_again_and_the_shard_arrives_verified(
        s3, fault_proxy, small_ranges, tmp_path, action):
    files, [entry], [data] = remote(s3, fault_proxy, [3 * RANGE + 1000])
    fault_proxy.add(Fault(entry["path"], action, times=1, range_start=RANGE))
    target = tmp_path / "shard.arrow"

    fetch_shard(files, entry["path"], entry, target, FAST)

    assert target.read_bytes() == data
    assert fault_proxy.gets(entry["path"], range_start=0) == 2  # the whole shard, again from the start
    assert fault_proxy.gets(entry["path"], range_start=RANGE) == 2


def test_a_shard_missing_from_the_store_raises_storage_error_saying_the_store_is_incomplete(s3, fault_proxy, tmp_path):
    files, [entry], _ = remote(s3, fault_proxy, [1000])
    s3.delete(f"{STORE}/{entry['path']}")

    with pytest.raises(StorageError, match="is missing from the store") as raised:
        fetch_shard(files, entry["path"], entry, tmp_path / "shard.arrow", FAST)
    assert files.url(entry["path"]) in str(raised.value)
    assert fault_proxy.gets(entry["path"]) == 1  # a missing object is not retried


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (a device whose writes fail with ENOSPC)")
@pytest.mark.parametrize("size", [1000, 200_000], ids=["buffered", "direct-write"])
def test_a_full_local_disk_raises_local_disk_full_error_naming_the_folder(s3, fault_proxy, tmp_path, size):
    files, [entry], _ = remote(s3, fault_proxy, [size])
    target = tmp_path / "shard.arrow"
    target.symlink_to("/dev/full")  # every write through it fails with a real ENOSPC

    with pytest.raises(LocalDiskFullError) as raised:
        fetch_shard(files, entry["path"], entry, target, FAST)

    assert raised.value.errno == errno.ENOSPC
    message = str(raised.value)
    assert "The local cache disk is full: no room for a" in message and f"shard in {tmp_path} (" in message
    assert "lower cache_budget" in message
    assert fault_proxy.gets(entry["path"]) == 1  # a full disk is not a network error: no retry
    assert not target.is_symlink() and os.path.exists("/dev/full")


def test_fetch_retries_reject_negative_values():
    with pytest.raises(ValueError, match="must be >= 0"):
        FetchRetries(max_retries=-1)
