"""Background fetching of the shards a reader needs next: in order, a few at once, stopped by a full cache."""

from __future__ import annotations

import threading
import time

from lightning_tune_data.cache.prefetcher import ShardPrefetcher


def wait_until(condition, timeout: float = 10.0) -> None:  # noqa: ANN001
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def test_requested_shards_are_fetched_first_requested_first_several_at_once():
    started, release = [], threading.Event()

    def fetch(shard: int) -> bool:
        started.append(shard)
        release.wait(10)
        return True

    prefetcher = ShardPrefetcher(fetch, threads=3)
    prefetcher.want([4, 1, 7, 2])
    wait_until(lambda: len(started) == 3)
    assert started == [4, 1, 7]  # three at once, in the order they are needed
    release.set()
    wait_until(lambda: len(started) == 4)
    assert started[-1] == 2


def test_a_new_request_replaces_the_shards_not_started_yet():
    started, gate = [], threading.Event()

    def fetch(shard: int) -> bool:
        started.append(shard)
        gate.wait(10)
        return True

    prefetcher = ShardPrefetcher(fetch, threads=1)
    prefetcher.want([1, 2, 3])
    wait_until(lambda: started == [1])
    prefetcher.want([9])
    gate.set()
    wait_until(lambda: len(started) == 2)
    time.sleep(0.05)
    assert started == [1, 9]


def test_no_room_stops_the_request_until_the_next_one():
    calls = []
    prefetcher = ShardPrefetcher(lambda shard: calls.append(shard) or False, threads=1)
    prefetcher.want([5, 6, 7])
    wait_until(lambda: calls == [5])
    time.sleep(0.05)
    assert calls == [5]
    prefetcher.want([6])
    wait_until(lambda: calls == [5, 6])


def test_a_reader_waits_for_this_processes_fetch_of_the_shard_it_needs():
    gate, finished = threading.Event(), []

    def fetch(shard: int) -> bool:
        gate.wait(10)
        finished.append(shard)
        return True

    prefetcher = ShardPrefetcher(fetch, threads=1)
    prefetcher.want([3])
    wait_until(lambda: 3 in prefetcher._in_flight)  # noqa: SLF001
    threading.Timer(0.1, gate.set).start()
    prefetcher.wait_for(3)
    assert finished == [3]
    prefetcher.wait_for(8)  # nothing in flight: returns at once
