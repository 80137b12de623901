"""``CacheCounters``: what one store's node cache did, counted across a run's processes.

A store read shard by shard is read in every dataloader worker of a rank, each its own process,
while the metrics are logged from the rank's main process. Each process counts in its own small
file (six numbers written in place, 48 bytes) in a folder the rank's main process made when it
opened the store; the folder travels with the store into its workers (forked or pickled), and
:meth:`CacheCounters.totals` sums every file in it. Counting costs a ``pwrite`` per event (a
shard opened, downloaded or evicted), never a lock or a message between processes. The folder is
removed when the process that made it ends.
"""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
import threading
import uuid
import weakref
from pathlib import Path
from typing import Any

from lightning_tune_data.cache.owners import after_fork_in_child

__all__ = ["CACHE_METRICS", "CacheCounters"]

#: What a store's node cache counts, in the order of a counter file: bytes downloaded, shards a
#: reader found on the node (hits) or had to wait for (misses), shards this run's readers evicted,
#: seconds readers waited for a shard, and times a reader went over the budget by a shard.
CACHE_METRICS = ("downloaded_bytes", "hits", "misses", "evictions", "wait_s", "over_budget")
_RECORD = struct.Struct(f"<{len(CACHE_METRICS)}d")


def _remove_folder(folder: str, owner: int) -> None:
    if os.getpid() == owner:  # never from a forked worker that inherited the finalizer
        shutil.rmtree(folder, ignore_errors=True)


class CacheCounters:
    """Counters of one store's node cache, summed over the processes of a rank.

    Args:
        folder: the counters' folder (``None``: a new temporary one, removed when this process ends).
    """

    def __init__(self, folder: str | None = None) -> None:
        if folder is None:
            folder = tempfile.mkdtemp(prefix="lightning-tune-data-cache-counters-")
            weakref.finalize(self, _remove_folder, folder, os.getpid())
        self.folder = folder
        self._start_here()

    def _start_here(self) -> None:
        self._values = [0.0] * len(CACHE_METRICS)
        self._fd: int | None = None
        self._guard = threading.Lock()
        after_fork_in_child(self, CacheCounters._start_here)  # a forked worker counts in a file of its own

    def __getstate__(self) -> dict[str, Any]:
        return {"folder": self.folder}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.folder = state["folder"]
        self._start_here()

    def add(self, metric: str, amount: float = 1.0) -> None:
        """Count ``amount`` more of ``metric`` (one of :data:`CACHE_METRICS`) in this process."""
        index = CACHE_METRICS.index(metric)
        with self._guard:
            self._values[index] += amount
            try:
                if self._fd is None:
                    path = Path(self.folder) / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.counts"
                    self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
                os.pwrite(self._fd, _RECORD.pack(*self._values), 0)
            except OSError:  # the folder is gone (its run ended): counting is best effort
                pass

    def totals(self) -> dict[str, float]:
        """Every process's counts summed, by metric (a file being written counts as before the write)."""
        totals = [0.0] * len(CACHE_METRICS)
        try:
            names = os.listdir(self.folder)
        except OSError:
            names = []
        for name in names:
            try:
                data = (Path(self.folder) / name).read_bytes()
            except OSError:
                continue
            if len(data) == _RECORD.size:
                totals = [total + value for total, value in zip(totals, _RECORD.unpack(data))]
        return dict(zip(CACHE_METRICS, totals))
