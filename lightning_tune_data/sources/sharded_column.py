"""Reading a store shard by shard through the node cache: its columns, and which shards to keep.

:class:`ShardedColumn` reads rows of one list column of a
:class:`~lightning_tune_data.cache.cached_store.CachedStore` as zero-copy views, opening a shard
(fetching it into the node cache when missing) the first time one of its rows is read; its flat
view (:class:`~lightning_tune_data.sources.sharded_tokens.ShardedFlat`) addresses every shard's
tokens, so a packer keeps documents as positions, as for a store on this node.

:class:`WindowReads` is what a reader tells the cache as it walks a pass: entering a window of
the two-level order, it keeps (pins) the shards of this window and the next, fetches the ones
still missing in the background (and those of the windows after, within half of the budget),
lets go of the rest, and tells the cache each shard's next use
(its window from here on, this pass or the next) so the cache evicts the one needed furthest away.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np

from lightning_tune_data.sources.arrow_columns import ListColumn
from lightning_tune_data.sources.sharded_tokens import ShardedFlat
from lightning_tune_data.sources.windowed_order import WindowedPermutation

__all__ = ["ShardedColumn", "WindowReads"]


class ShardedColumn:
    """One list column of a cached store, read shard by shard.

    Args:
        store: the :class:`~lightning_tune_data.cache.cached_store.CachedStore`.
        name: the column's name.
        source: the source's name (for error messages).
    """

    def __init__(self, store: Any, name: str, source: str) -> None:
        self._store = store
        self._name = name
        self._source = source
        self._shards: dict[int, ListColumn] = {}  # the shards being read (pinned)
        self._flat = ShardedFlat(self)

    @property
    def store(self) -> Any:
        """The cached store."""
        return self._store

    def __len__(self) -> int:
        return len(self._store)

    def shard_reader(self, shard: int, pin: bool = True) -> ListColumn:
        """The column's reader of shard ``shard``: opened and pinned when it is not (``pin``), or
        for a document read again after its window, without pinning it (see
        :meth:`~lightning_tune_data.cache.cached_store.CachedStore.open_shard`)."""
        column = self._shards.get(shard)
        if column is not None or pin:
            return self._shard(shard)
        return self._store.reader(shard, self._name, self._column_of, pin=False)

    def _shard(self, shard: int) -> ListColumn:
        column = self._shards.get(shard)
        if column is None:
            column = self._shards[shard] = self._store.reader(shard, self._name, self._column_of)
        return column

    def _column_of(self, table: Any) -> ListColumn:
        if self._name not in table.column_names:
            raise KeyError(f"Source '{self._source}': a shard of the store has no '{self._name}' column (columns: "
                           f"{table.column_names}); the store is damaged, prepare it again.")
        return ListColumn(table.column(self._name), self._name, self._source)

    def keep_only(self, shards: set[int]) -> None:
        """Stop reading the open shards not in ``shards`` (they are opened again, pinned, when
        read again; views already handed out stay valid)."""
        for shard in [shard for shard in self._shards if shard not in shards]:
            del self._shards[shard]
        self._flat.forget(shards)

    def row(self, index: int) -> np.ndarray:
        """A zero-copy view of row ``index`` (a document read again, e.g. held in a pack when a
        checkpoint was taken: its shard is not pinned for it)."""
        shard = int(self._store.shard_of(np.array([index]))[0])
        return self.shard_reader(shard, pin=False).row(index - int(self._store.shard_starts[shard]))

    def rows(self, indices: np.ndarray) -> list[np.ndarray]:
        """Zero-copy views of several rows, in order."""
        indices = np.asarray(indices, dtype=np.int64)
        shards = self._store.shard_of(indices)
        views: list[Any] = [None] * len(indices)
        for shard in np.unique(shards).tolist():
            where = np.flatnonzero(shards == shard)
            local = indices[where] - self._store.shard_starts[shard]
            for at, view in zip(where.tolist(), self._shard(shard).rows(local)):
                views[at] = view
        return views

    def rows_and_lengths(self, indices: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        """Zero-copy views of several rows and their lengths."""
        views = self.rows(indices)
        return views, np.fromiter(map(len, views), dtype=np.int64, count=len(views))

    def flat(self) -> ShardedFlat:
        """The flat view of every shard's values (positions are shard-tagged)."""
        return self._flat


class WindowReads:
    """What one reader keeps and fetches ahead, as it walks the windows of the passes.

    Args:
        store: the cached store.
        order_of: the order of a pass, by pass number.
        columns: the columns that open shards (told which to forget).
    """

    def __init__(self, store: Any, order_of: Callable[[int], WindowedPermutation], columns: list[ShardedColumn]) -> None:
        self._store = store
        self._order_of = order_of
        self._columns = columns
        self._at: tuple[int, int] | None = None
        # pass -> (windows of the pass, each shard's windows in it, sorted); replaced, never changed
        self._shard_windows: dict[int, tuple[int, list[np.ndarray]]] = {}
        self.released: set[int] = set()  # shards let go of since the reader last asked
        self._taking = False  # whether a reader takes them (a packer): else nothing is kept mapped

    def take_released(self) -> set[int]:
        """The shards let go of since the last call. A packer takes them after each read and
        copies out the documents it holds of them; their mappings live until it says it has
        (:meth:`copied_out`, or the node's cache needs room), so nothing is mapped or fetched again."""
        released, self.released = self.released, set()
        self._taking = True
        return released

    def copied_out(self) -> None:
        """The reader has copied out what it held of the shards it took (:meth:`take_released`):
        every mapping of a shard it does not read now goes at once. An idle reader (a dataloader
        worker waiting for its turn) must hold no shard the node's other readers need room for."""
        self._store.let_go_kept()
        pinned = set(self._store.pinned())
        for column in self._columns:
            column.keep_only(pinned)

    def forget_position(self) -> None:
        """The order changed (a checkpoint's was adopted): act again on the next read."""
        self._at = None
        self._shard_windows = {}

    def shards_of_window(self, order: WindowedPermutation, window: int) -> list[int]:
        """The shards holding window ``window``'s blocks, in the order its blocks come."""
        starts = order.blocks_of_window(window) * order.block_rows
        ends = np.minimum(starts + order.block_rows, order.num_items)
        first, last = self._store.shard_of(starts), self._store.shard_of(ends - 1)
        shards: dict[int, None] = {}
        for low, high in zip(first.tolist(), last.tolist()):
            shards.update(dict.fromkeys(range(low, high + 1)))
        return list(shards)

    def moved_to(self, epoch: int, positions: np.ndarray) -> int:
        """The reader's next positions are ``positions`` (ascending) of pass ``epoch``: act when
        its window changed; returns how many of them lie in the window of the first."""
        order = self._order_of(epoch)
        windows = order.window_of(positions)
        window = int(windows[0])
        inside = int(np.searchsorted(windows, window, side="right"))
        if self._at != (epoch, window):
            self._at = (epoch, window)
            self._enter(order, epoch, window)
        return inside

    def _windows_of_shards(self, epoch: int) -> tuple[int, list[np.ndarray]]:
        """Pass ``epoch``'s window count, and the windows of every shard's blocks (sorted)."""
        known = self._shard_windows.get(epoch)
        if known is None:
            order = self._order_of(epoch)
            block_windows = order.block_windows()
            starts = self._store.shard_starts
            firsts = (starts[:-1] // order.block_rows).tolist()
            lasts = ((starts[1:] - 1) // order.block_rows).tolist()
            known = (order.num_windows, [np.unique(block_windows[first : last + 1]) for first, last in zip(firsts, lasts)])
        return known

    def _distances(self, epoch: int, window: int) -> Callable[[int], float]:
        """From a reader at ``window`` of pass ``epoch``: each shard's next use, in windows (its
        next window in this pass, or in the next pass). Called by the cache from its prefetch
        threads: it reads only the snapshot of the passes' shard windows taken when this reader
        entered its window (a position outside them counts every shard as needed now)."""
        known = self._shard_windows
        if epoch not in known or epoch + 1 not in known:
            return lambda shard: 0.0
        (windows, this_pass), (_, next_pass) = known[epoch], known[epoch + 1]

        def distance(shard: int) -> float:
            mine = this_pass[shard]
            later = int(np.searchsorted(mine, window))
            if later < len(mine):
                return float(mine[later] - window)
            return float(windows - window + int(next_pass[shard][0]))

        return distance

    def _enter(self, order: WindowedPermutation, epoch: int, window: int) -> None:
        """Keep the shards of ``window`` and the next one; let go of the rest (a packer copies out
        the documents it still holds of them); fetch ahead the
        shards of the windows that follow while they take at most half of the budget."""
        following = self._order_of(epoch + 1)
        upcoming = [self.shards_of_window(order, w) for w in range(window, min(order.num_windows, window + 2))]
        if len(upcoming) < 2:
            upcoming.append(self.shards_of_window(following, 0))
        keep = set(upcoming[0]) | set(upcoming[1])
        cache = self._store.cache
        for shard in self._store.pinned():
            if shard not in keep:
                self._store.close_shard(shard, keep_mapped=self._taking)  # see take_released
                self.released.add(shard)
        for column in self._columns:
            column.keep_only(keep)
        self._shard_windows = {e: self._windows_of_shards(e) for e in (epoch, epoch + 1)}
        cache.set_next_use(self._distances, epoch, window)
        wanted, room, seen = [], self._store.share // 2, set()
        later = ((order, w) for w in range(window, order.num_windows))
        for number, (pass_order, w) in enumerate(itertools.chain(later, ((following, w) for w in range(following.num_windows)))):
            shards = upcoming[number] if number < len(upcoming) else self.shards_of_window(pass_order, w)
            size = sum(int(self._store.shards[shard]["size"]) for shard in shards if shard not in seen)
            if number >= 2 and size > room:
                break
            room -= size
            wanted += [shard for shard in shards if shard not in seen]
            seen.update(shards)
        cache.prefetch(wanted)
