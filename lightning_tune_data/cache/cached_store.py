"""``CachedStore``: a committed remote store read shard by shard through this node's bounded cache.

It stands where a memory-mapped ``datasets.Dataset`` stands for a store on this machine: it knows
the store's rows (every shard's row count is in the commit, so nothing is downloaded to know
them) and opens a shard only when a reader asks for one of its rows, through a
:class:`~lightning_tune_data.cache.node_cache.NodeShardCache` made in the process that reads.
``order`` is how the shuffle mixes its rows: windows of blocks of rows (see
:mod:`lightning_tune_data.cache.window_plan`), chosen when a run starts and taken from the
checkpoint when it resumes (:meth:`CachedStore.adopt_order`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from lightning_tune_data.cache.node_cache import NodeShardCache
from lightning_tune_data.cache.owners import after_fork_in_child
from lightning_tune_data.cache.shard_fetch import FetchRetries
from lightning_tune_data.cache.sizes import human_size
from lightning_tune_data.cache.store_files import StoreFiles
from lightning_tune_data.cache.window_plan import check_window, pass_downloads
from lightning_tune_data.keys import ORDER_BLOCK, ORDER_WINDOW

__all__ = ["CachedStore"]


_STORES: weakref.WeakSet[CachedStore] = weakref.WeakSet()  # the stores read in this process


class CachedStore:
    """A committed remote store whose shards are fetched on demand into the node's bounded cache.

    What a process maps is decided here, in one place (:meth:`_let_go`): a shard a reader reads
    is *pinned* (mapped and kept until :meth:`close_shard`); any other shard's mapping is let go
    of as soon as it is not pinned, and lives on only while views handed out of it do, or until
    :meth:`let_go_kept` for a shard closed with ``keep_mapped`` (a packer first copies out the
    documents it holds of the shards a reader let go of, from the same mapping). A mapping holds the
    shard's lock, so the node never deletes a file a process still maps: what the disk holds is
    what the cache counts, and an idle process holds no more than the shards it reads.

    Args:
        files: the remote store.
        content: its commit.
        folder: the node's shard cache folder (``<local_cache_dir>/shard-cache``).
        budget: bytes of shards the node keeps (every store read shard by shard).
        order: the shuffle's blocks and windows (``{"block_rows": B, "window_blocks": W}``).
        description: names the source in messages.
        retries: how failing reads of a shard are retried.
        share: this store's share of the budget (what its windows and fetches ahead are sized
            to; default: all of it).
    """

    def __init__(self, files: StoreFiles, content: dict[str, Any], folder: Path, budget: int, order: dict[str, int],
                 description: str, retries: FetchRetries = FetchRetries(), share: int | None = None,
                 sharers: int = 1) -> None:
        store = content["store"]
        recorded = content.get("files") or {}
        self.shards = [{**recorded[entry["path"]], **entry} for entry in store["shards"]]
        self.columns = list(store.get("columns") or [])
        self.order = {key: int(value) for key, value in order.items()}
        self.budget = int(budget)
        self.share = int(budget if share is None else share)
        self.sharers = int(sharers)
        self.description = description
        self.shard_rows = np.array([int(entry["rows"]) for entry in self.shards], dtype=np.int64)
        self.shard_starts = np.concatenate([[0], np.cumsum(self.shard_rows)]).astype(np.int64)
        self.cache = NodeShardCache(files, folder, self.shards, budget, retries, description)
        self._start_here()

    def _start_here(self) -> None:
        # this process's mappings: shard -> (table, readers of its columns)
        self._mapped: dict[int, tuple[pa.Table, dict[str, Any]]] = {}
        self._pinned: set[int] = set()
        self._kept: set[int] = set()  # closed, mapped until let_go_kept
        self._room_hooks: list[weakref.WeakMethod] = []
        self.cache.on_room_needed = self._room_needed
        _STORES.add(self)
        after_fork_in_child(self, CachedStore._start_here)  # a forked child maps for itself

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_mapped", "_pinned", "_kept", "_room_hooks"):
            state.pop(key)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start_here()

    def close(self) -> None:
        """Drop every mapping and close the node cache (its threads and locks)."""
        self._mapped.clear()
        self._pinned.clear()
        self._kept.clear()
        self.cache.close()

    def __len__(self) -> int:
        return int(self.shard_starts[-1])

    @property
    def window(self) -> int:
        """Rows a shuffle window mixes."""
        return self.order[ORDER_BLOCK] * self.order[ORDER_WINDOW]

    @property
    def shard_sizes(self) -> np.ndarray:
        """Every shard's bytes."""
        return np.array([int(entry["size"]) for entry in self.shards], dtype=np.int64)

    def adopt_order(self, order: dict[str, int] | None) -> None:
        """Read the store in ``order`` (a checkpoint's), when this node's budget share holds it.

        Args:
            order: the saved blocks and windows; ``None``: the full shuffle of a store read whole.

        Raises:
            ValueError: the budget cannot hold the order's window and the next one (naming the
                budget needed), or the order is the full shuffle (it needs the whole store).
        """
        if order is None:
            raise ValueError(
                f"{self.description}: the checkpoint was written reading the whole store ({human_size(self.size)}), in "
                f"its full shuffle, but this node's cache_budget gives it {human_size(self.share)}; the same position "
                f"would mean other rows. Raise cache_budget to at least {human_size(self.size * self.sharers)} to "
                "resume exactly, or resume with `resume_data_state: false` to start the data from the beginning.")
        order = {key: int(value) for key, value in order.items()}
        if order != self.order:
            check_window(self.shard_rows.tolist(), self.shard_sizes.tolist(), self.share, order, self.description,
                         self.sharers, "or resume with `resume_data_state: false` to start the data from the beginning")
            self.order = order

    def describe_plan(self) -> str:
        """One line: what reading this store through the node cache will do (budget, window, shards,
        downloads per pass)."""
        block, blocks = self.order[ORDER_BLOCK], self.order[ORDER_WINDOW]
        downloads = pass_downloads(self.shard_starts, self.shard_sizes, self.order)
        share = f" (this store's share: {human_size(self.share)})" if self.share != self.budget else ""
        return (f"{self.description}: reading {self.cache.files.url()} ({human_size(self.size)} in {self.num_shards} "
                f"shards, {len(self):,} rows) through the node's shard cache at {self.cache.node_folder}: cache_budget "
                f"{human_size(self.budget)}{share}, shuffle window of {self.window:,} rows ({blocks} block{'s' if blocks != 1 else ''} of "
                f"{block:,} rows), downloads per pass at most {human_size(downloads)} of shards")

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

    def pinned(self) -> list[int]:
        """The shards this process reads now (mapped and kept until :meth:`close_shard`)."""
        return sorted(self._pinned)

    def open_shard(self, shard: int, pin: bool = True) -> pa.Table:
        """Shard ``shard``'s table, memory-mapped from the node cache (fetched first when missing).

        A shard this process still maps is not mapped again (the next pass reads it at no cost).

        Args:
            shard: the shard's number.
            pin: keep it until :meth:`close_shard`; without, for a document read again after its
                window (held in a pack), this process lets go of its mapping at once (the table
                returned keeps it alive while it is used).
        """
        return self._open(shard, pin)[0]

    def _open(self, shard: int, pin: bool) -> tuple[pa.Table, dict[str, Any]]:
        mapped = self._mapped.get(shard)
        if mapped is None:
            mapping = self.cache.map(shard)
            mapped = self._mapped[shard] = (pa.ipc.open_stream(pa.py_buffer(mapping)).read_all(), {})
        if pin:
            self._pinned.add(shard)
        else:
            self._let_go(shard)
        return mapped

    def reader(self, shard: int, name: str, make: Callable[[pa.Table], Any], pin: bool = True) -> Any:
        """What ``make`` builds from shard ``shard``'s table for column ``name`` (e.g. a column
        reader), built once per mapping of the shard (``pin``: see :meth:`open_shard`)."""
        table, readers = self._open(shard, pin)
        if name not in readers:
            readers[name] = make(table)
        return readers[name]

    def close_shard(self, shard: int, keep_mapped: bool = False) -> None:
        """Stop reading shard ``shard``: its mapping is let go of (views into it stay valid), or
        with ``keep_mapped`` kept until :meth:`let_go_kept`."""
        self._pinned.discard(shard)
        if keep_mapped:
            self._kept.add(shard)
        self._let_go(shard)

    def let_go_kept(self) -> None:
        """Let go of the mappings of the shards closed with ``keep_mapped``."""
        kept, self._kept = self._kept, set()
        for shard in kept:
            self._let_go(shard)

    def when_room_is_needed(self, let_go: Callable[[], None]) -> None:
        """Call ``let_go`` (a bound method, held weakly) when this process waits for room in the
        node's cache: a reader drops the views of shards it does not read now."""
        self._room_hooks.append(weakref.WeakMethod(let_go))

    def _room_needed(self) -> None:
        """Every store of this process lets go of the mappings it keeps and the views it does not
        read now (they share the node's budget)."""
        for store in list(_STORES):
            store.let_go_kept()
            for hook in list(store._room_hooks):
                method = hook()
                if method is None:
                    store._room_hooks.remove(hook)
                else:
                    method()

    def _let_go(self, shard: int) -> None:
        """The one place a mapping is dropped: ``shard``'s, unless a reader pins it (or it was
        closed with ``keep_mapped``). The file can be evicted once the views handed out of it are
        gone too."""
        if shard not in self._pinned and shard not in self._kept:
            self._mapped.pop(shard, None)

    def __repr__(self) -> str:
        return (f"CachedStore({self.cache.files.url()}, {len(self)} rows in {self.num_shards} shards, "
                f"budget={human_size(self.budget)}, window={self.window} rows)")
