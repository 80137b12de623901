"""``CachedStore``: a committed remote store read shard by shard through this node's bounded cache.

It stands where a memory-mapped ``datasets.Dataset`` stands for a store on this machine: it knows
the store's rows (every shard's row count is in the commit, so nothing is downloaded to know
them) and opens a shard only when a reader asks for one of its rows, through a
:class:`~lightning_tune_data.cache.node_cache.NodeShardCache` made in the process that reads.
``window`` is how many shards the shuffle mixes at a time (see
:mod:`lightning_tune_data.sources.windowed_order`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from lightning_tune_data.cache.node_cache import NodeShardCache
from lightning_tune_data.cache.shard_fetch import FetchRetries
from lightning_tune_data.cache.sizes import human_size
from lightning_tune_data.cache.store_files import StoreFiles

__all__ = ["CachedStore", "shuffle_window_for"]

#: A budget holds this many windows by default: the window being read, the next one (fetched
#: ahead) and room for readers of a node that are a window apart.
WINDOWS_PER_BUDGET = 4
#: Windows of shards let go of whose mappings a reading process keeps (documents of them that
#: packs still hold are read without fetching the shard again).
RETIRED_WINDOWS = 1
#: Windows a reader keeps at once: the one being read and the next (fetched ahead).
WINDOWS_KEPT = 2


def shuffle_window_for(shard_sizes: list[int], budget: int, window: int | None, description: str) -> int:
    """Shards per shuffle window for a store read through ``budget`` bytes.

    Args:
        shard_sizes: every shard's size in bytes.
        budget: the node cache's budget for the store.
        window: the window asked for; ``None`` derives it (a quarter of the budget's shards).
        description: names the source in errors.

    Raises:
        ValueError: the budget cannot hold the windows a reader keeps (:data:`WINDOWS_KEPT`).
    """
    largest = max(shard_sizes)
    fitting = budget // largest
    if window is None:
        window = max(1, fitting // WINDOWS_PER_BUDGET)
    if window < 1:
        raise ValueError(f"{description}: shuffle_window must be >= 1 shard, got {window}.")
    needed = WINDOWS_KEPT * window * largest
    if needed > budget:
        size = human_size if human_size(budget) != human_size(needed) else (lambda count: f"{count:,} bytes")
        raise ValueError(
            f"{description}: cache_budget {size(budget)} cannot hold a shuffle window of {window} shard(s) and the "
            f"next window fetched ahead ({WINDOWS_KEPT * window} shards of up to {human_size(largest)}: {size(needed)}). "
            f"Raise cache_budget to at least {size(needed)}, or lower shuffle_window"
            + ("." if window > 1 else " (it is already 1 shard: the store's shards are large; prepare it with a smaller shard_size).")
        )
    return int(window)


class CachedStore:
    """A committed remote store whose shards are fetched on demand into a bounded node cache.

    Args:
        files: the remote store.
        content: its commit.
        folder: this store's folder in the node cache.
        budget: bytes of shards kept on this node.
        window: shards per shuffle window.
        description: names the source in messages.
        retries: how failing reads of a shard are retried.
    """

    def __init__(self, files: StoreFiles, content: dict[str, Any], folder: Path, budget: int, window: int,
                 description: str, retries: FetchRetries = FetchRetries()) -> None:
        store = content["store"]
        recorded = content.get("files") or {}
        self.shards = [{**recorded[entry["path"]], **entry} for entry in store["shards"]]
        self.columns = list(store.get("columns") or [])
        self.window = int(window)
        self.budget = int(budget)
        self.description = description
        self.shard_rows = np.array([int(entry["rows"]) for entry in self.shards], dtype=np.int64)
        self.shard_starts = np.concatenate([[0], np.cumsum(self.shard_rows)]).astype(np.int64)
        self.cache = NodeShardCache(files, folder, self.shards, budget, retries, description)
        # this process's mappings: shard -> (inode, table, readers of its columns)
        self._mapped: dict[int, tuple[int, pa.Table, dict[str, Any]]] = {}
        self._retired: OrderedDict[int, None] = OrderedDict()  # the shards let go of last, kept mapped
        self.cache.on_evict = self._unmap

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_mapped"], state["_retired"] = {}, OrderedDict()
        return state

    def __len__(self) -> int:
        return int(self.shard_starts[-1])

    @property
    def num_shards(self) -> int:
        """Shards of the store."""
        return len(self.shards)

    @property
    def size(self) -> int:
        """Bytes of all shards."""
        return sum(int(entry["size"]) for entry in self.shards)

    def shard_of(self, rows: np.ndarray) -> np.ndarray:
        """The shard of each row."""
        return np.searchsorted(self.shard_starts, rows, side="right") - 1

    def open_shard(self, shard: int, pin: bool = True) -> pa.Table:
        """Shard ``shard``'s table, memory-mapped from the node cache (fetched first when missing).

        A shard this process mapped before and that is still the same file is not mapped again
        (the next pass reads it at no cost).

        Args:
            shard: the shard's number.
            pin: keep it from eviction until :meth:`close_shard`; without, a mapping this
                process still has is used as it is (a mapping stays valid after its file is
                evicted), else the shard is fetched (without waiting for room: it is let go of
                at once), mapped and let go of: for a document read again after its window
                (held in a pack), which must not hold the cache's room.
        """
        mapped = self._mapped.get(shard)
        if not pin and mapped is not None:
            if shard in self._retired:
                self._retired.move_to_end(shard)
            return mapped[1]
        path = self.cache.acquire(shard, wait_for_room=pin)
        try:
            inode = path.stat().st_ino
            if mapped is None or mapped[0] != inode:
                with pa.memory_map(str(path)) as source:
                    mapped = self._mapped[shard] = (inode, pa.ipc.open_stream(source).read_all(), {})
        finally:
            if not pin:
                self.close_shard(shard)
        return mapped[1]

    def reader(self, shard: int, name: str, make: Callable[[pa.Table], Any], pin: bool = True) -> Any:
        """What ``make`` builds from shard ``shard``'s table for column ``name`` (e.g. a column
        reader), built once per mapping of the shard (``pin``: see :meth:`open_shard`)."""
        table = self.open_shard(shard, pin)
        readers = self._mapped[shard][2]
        if name not in readers:
            readers[name] = make(table)
        return readers[name]

    def _unmap(self, shard: int) -> None:
        """Forget this process's mapping of an evicted shard (its disk space is freed once the
        views handed out of it are dropped), unless it is one of the shards let go of last."""
        if shard not in self._retired:
            self._mapped.pop(shard, None)

    def unmap_evicted(self) -> None:
        """Drop the mappings of shards that are not pinned and whose file was evicted by any
        process of the node."""
        pinned = set(self.cache.pinned())
        for shard, (inode, _, _) in list(self._mapped.items()):
            if shard not in pinned and shard not in self._retired and not self._same_file(shard, inode):
                self._unmap(shard)

    def _same_file(self, shard: int, inode: int) -> bool:
        """Whether shard ``shard``'s file in the cache is still the one mapped (not evicted)."""
        try:
            return self.cache.path(shard).stat().st_ino == inode
        except FileNotFoundError:
            return False

    def close_shard(self, shard: int) -> None:
        """Let the cache evict shard ``shard`` (views into it stay valid). This process keeps
        the mappings of the last ``window`` shards it let go of, evicted or not, so documents of
        them that packs still hold are read without fetching the shard again."""
        self.cache.release(shard)
        self._retired[shard] = None
        self._retired.move_to_end(shard)
        while len(self._retired) > self.window * RETIRED_WINDOWS:
            oldest, _ = self._retired.popitem(last=False)
            mapped = self._mapped.get(oldest)
            if mapped is not None and oldest not in self.cache.pinned() and not self._same_file(oldest, mapped[0]):
                self._mapped.pop(oldest, None)  # the prefetch thread may have unmapped it meanwhile

    def __repr__(self) -> str:
        return (f"CachedStore({self.cache.files.url()}, {len(self)} rows in {self.num_shards} shards, "
                f"budget={human_size(self.budget)}, window={self.window})")
