"""``ShardPrefetcher``: a few background threads that fetch the shards a reader will need next.

A reader hands it the shards of its next positions, in the order it will need them; each
request replaces the previous one. Threads take the first shard not yet being fetched, so
several shards arrive at once (storage is latency-bound per request) and the one needed first
starts first. A fetch that finds no room stops the request: it is asked again when the reader
moves on. A reader that needs a shard this process is already fetching waits for that fetch
instead of starting its own.
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

    def want(self, shards: list[int]) -> None:
        """Fetch ``shards`` (missing ones, in the order they are needed), replacing the previous request."""
        with self._changed:
            self._wanted = [shard for shard in shards if shard not in self._in_flight]
            self._changed.notify_all()
        if not self._started:
            self._started = True
            for number in range(self._threads):
                threading.Thread(target=self._work, name=f"shard-prefetch-{number}", daemon=True).start()

    def wait_for(self, shard: int) -> None:
        """Return once this process's fetch of ``shard``, if one is running, has ended."""
        with self._changed:
            event = self._in_flight.get(shard)
        if event is not None:
            event.wait()

    def _work(self) -> None:
        while True:
            with self._changed:
                while not self._wanted:
                    self._changed.wait()
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
