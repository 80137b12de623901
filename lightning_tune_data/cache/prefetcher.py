"""``ShardPrefetcher``: a few background threads that fetch the shards a reader will need next.

A reader hands it the shards of its next positions, in the order it will need them; each
request replaces the previous one. Threads take the first shard not yet being fetched, so
several shards arrive at once (storage is latency-bound per request) and the one needed first
starts first. A fetch that finds no room stops the request: it is asked again when the reader
moves on. A reader that needs a shard this process is already fetching waits for that fetch
instead of starting its own. :meth:`ShardPrefetcher.stop` ends the threads (at the end of a
process, or when the cache is closed); a fetch in flight is then cut short by the cache.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["PREFETCH_THREADS", "ShardPrefetcher"]

log = logging.getLogger("lightning_tune_data.cache.store")

#: Shards fetched at once per process.
PREFETCH_THREADS = 4


class ShardPrefetcher:
    """Fetch requested shards in the background, in order, a few at a time.

    Args:
        fetch: fetches one shard if there is room; ``False`` when there is none now.
        threads: shards fetched at once.
    """

    def __init__(self, fetch: Callable[[int], bool], threads: int = PREFETCH_THREADS) -> None:
        self._fetch = fetch
        self._threads = threads
        self._wanted: list[int] = []
        self._in_flight: dict[int, threading.Event] = {}
        self._changed = threading.Condition()
        self._started = False
        self._stopped = False
        self._workers: list[threading.Thread] = []

    def want(self, shards: list[int]) -> None:
        """Fetch ``shards`` (missing ones, in the order they are needed), replacing the previous request."""
        with self._changed:
            if self._stopped:
                return
            self._wanted = [shard for shard in shards if shard not in self._in_flight]
            self._changed.notify_all()
            if not self._started:
                self._started = True
                self._workers = [threading.Thread(target=self._work, name=f"shard-prefetch-{number}", daemon=True)
                                 for number in range(self._threads)]
                for worker in self._workers:
                    worker.start()

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called (a fetch in flight should stop early)."""
        return self._stopped

    def runs_here(self) -> bool:
        """Whether the calling thread is one of the prefetch threads."""
        return threading.current_thread() in self._workers

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the threads: no new fetch starts; waits up to ``timeout_s`` for those in flight."""
        with self._changed:
            self._stopped = True
            self._wanted = []
            self._changed.notify_all()
        for worker in self._workers:
            if worker is not threading.current_thread():
                worker.join(timeout=timeout_s)

    def wait_for(self, shard: int) -> None:
        """Return once this process's fetch of ``shard``, if one is running, has ended."""
        with self._changed:
            event = self._in_flight.get(shard)
        if event is not None:
            event.wait()

    def _work(self) -> None:
        while True:
            with self._changed:
                while not self._wanted and not self._stopped:
                    self._changed.wait()
                if self._stopped:
                    return
                shard = self._wanted.pop(0)
                event = self._in_flight[shard] = threading.Event()
            try:
                if not self._fetch(shard):
                    with self._changed:
                        self._wanted = []  # no room now
            except Exception as error:  # noqa: BLE001 - the reader fetches it itself and reports the error
                log.debug("prefetching shard %d failed: %s", shard, error)
                with self._changed:
                    self._wanted = []
            finally:
                with self._changed:
                    del self._in_flight[shard]
                event.set()
