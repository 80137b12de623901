"""The token ids of a store read shard by shard, as one address space a packer can slice.

A packer keeps each document as the position of its first token in its source's flat token
array, and builds batch rows by slicing that array (no Python object per document). A store
read through the node cache has no single array: each shard is mapped on its own. Here a
document's position is ``shard << SHARD_BITS | position in that shard's flat values``, and
slicing resolves the shard (opening it again through the cache when it was let go, e.g. for a
document a packer held across windows), so the packer's fast path works unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from lightning_tune_data.keys import SHARD_BITS

__all__ = ["UNPINNED_VIEWS", "ShardedFlat", "ShardedSlices"]

_INSIDE = (1 << SHARD_BITS) - 1
#: Views of shards the reader does not pin kept at once (the oldest go first).
UNPINNED_VIEWS = 2


class ShardedSlices:
    """Slices ``[a:b]`` of the sharded token space, as NumPy arrays or memoryviews.

    Args:
        flat: the :class:`ShardedFlat` whose shards it reads.
        as_memoryview: hand out memoryview slices (for a byte join) instead of arrays.
    """

    def __init__(self, flat: ShardedFlat, as_memoryview: bool) -> None:
        self._flat = flat
        self._memoryview = as_memoryview
        self._views: dict[int, Any] = {}

    @property
    def dtype(self) -> np.dtype:
        """The token ids' dtype (of the shard read first)."""
        return self._flat.dtype

    def _trim(self) -> None:
        """Keep the views of the shards the reader reads, and of at most :data:`UNPINNED_VIEWS`
        others (held documents of shards let go of): a view keeps its shard's mapping, which
        keeps the shard on the node's disk."""
        pinned = set(self._flat.pinned())
        others = [shard for shard in self._views if shard not in pinned]
        for shard in others[: max(0, len(others) - UNPINNED_VIEWS)]:
            del self._views[shard]

    def forget(self, keep: set[int]) -> None:
        """Drop the views of shards not in ``keep`` (so an evicted shard's mapping can go)."""
        for shard in [shard for shard in self._views if shard not in keep]:
            del self._views[shard]

    def __getitem__(self, key: slice) -> Any:
        start = key.start
        shard = start >> SHARD_BITS
        view = self._views.get(shard)
        if view is None:
            values = self._flat.shard_values(shard)
            view = self._views[shard] = memoryview(values) if self._memoryview else values
            self._trim()
        inside = start & _INSIDE
        return view[inside : inside + (key.stop - start)]

    def slices(self, positions: Iterable[int], lengths: Iterable[int]) -> list[Any]:
        """``[self[p : p + n] for p, n in zip(positions, lengths)]`` in one call: a batch's pieces
        (the per-piece method call is most of what slicing a sharded space costs).

        Raises:
            TypeError: a position is not an ``int`` (a piece that holds its own array).
        """
        views, parts = self._views, []
        append = parts.append
        for start, length in zip(positions, lengths):
            view = views.get(start >> SHARD_BITS)
            if view is None:
                append(self[start : start + length])
            else:
                inside = start & _INSIDE
                append(view[inside : inside + length])
        return parts


class ShardedFlat:
    """Flat positions of a sharded ``list<int>`` column (what :class:`~lightning_tune_data.sources.arrow_columns.FlatColumn`
    is for one table).

    Args:
        column: the :class:`~lightning_tune_data.sources.sharded_column.ShardedColumn`.
    """

    def __init__(self, column: Any) -> None:
        self._column = column
        self.dtype: np.dtype | None = None
        self.values = ShardedSlices(self, as_memoryview=False)
        self.views = ShardedSlices(self, as_memoryview=True)
        column.store.when_room_is_needed(self.forget_unpinned)

    def forget_unpinned(self) -> None:
        """Drop the views of shards the reader does not read now (the node's cache needs room)."""
        self.forget(set(self.pinned()))

    def pinned(self) -> list[int]:
        """The shards the reader pins (reads now)."""
        return self._column.store.pinned()

    def _flat_of(self, shard: int, pin: bool) -> Any:
        """Shard ``shard``'s :class:`~lightning_tune_data.sources.arrow_columns.FlatColumn` (the
        shard is opened when it is not; ``pin``: see ``ShardedColumn.shard_reader``)."""
        flat = self._column.shard_reader(shard, pin=pin).flat()
        if flat is None:
            raise TypeError("the token ids of the store's shards are not null-free integers; prepare the store again.")
        if self.dtype is None:
            self.dtype = flat.values.dtype
        return flat

    def shard_values(self, shard: int) -> np.ndarray:
        """Shard ``shard``'s flat token values (the shard is opened when it is not)."""
        return self._flat_of(shard, pin=False).values  # a held document's shard may be past

    def positions(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each row's first token's position in the sharded token space, and its length."""
        rows = np.asarray(rows, dtype=np.int64)
        store = self._column.store
        shards = store.shard_of(rows)
        positions = np.empty(len(rows), dtype=np.int64)
        lengths = np.empty(len(rows), dtype=np.int64)
        for shard in np.unique(shards).tolist():
            where = np.flatnonzero(shards == shard)
            flat = self._flat_of(shard, pin=True)
            inside, lengths[where] = flat.positions(rows[where] - store.shard_starts[shard])
            positions[where] = (shard << SHARD_BITS) + inside
        return positions, lengths

    def forget(self, keep: set[int]) -> None:
        """Drop the slices' views of shards not in ``keep``."""
        self.values.forget(keep)
        self.views.forget(keep)
