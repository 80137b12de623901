"""CacheCounters: counts of one store's node cache, summed over the processes that read it."""

from __future__ import annotations

import multiprocessing
import os
import pickle

import pytest

from lightning_tune_data.cache.cache_counters import CACHE_METRICS, CacheCounters

FORK = multiprocessing.get_context("fork")


def _count_in_a_child(counters: CacheCounters, bytes_: int) -> None:
    counters.add("downloaded_bytes", bytes_)
    counters.add("misses")
    pickle.loads(pickle.dumps(counters)).add("hits", 2)  # a copy pickled into another process counts too


@pytest.mark.slow
def test_counts_of_forked_worker_processes_are_summed_with_this_processs():
    counters = CacheCounters()
    counters.add("downloaded_bytes", 100)
    counters.add("wait_s", 0.5)
    workers = [FORK.Process(target=_count_in_a_child, args=(counters, 1000 * (n + 1))) for n in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(30)
    assert [worker.exitcode for worker in workers] == [0, 0]
    totals = counters.totals()
    assert list(totals) == list(CACHE_METRICS)
    assert totals == {"downloaded_bytes": 3100.0, "hits": 4.0, "misses": 2.0, "evictions": 0.0, "wait_s": 0.5,
                      "over_budget": 0.0}
    assert counters.totals() == totals  # reading does not change them


def test_the_folder_is_removed_when_the_counters_are_gone_and_counting_afterwards_is_harmless():
    counters = CacheCounters()
    folder = counters.folder
    copy = pickle.loads(pickle.dumps(counters))
    del counters
    assert not os.path.exists(folder)
    copy.add("hits")  # the run ended: nothing to count into, nothing raised
    assert copy.totals()["hits"] == 0.0
