"""``WindowedPermutation``: a shuffle that a bounded node cache can serve.

A store read through a byte budget cannot have every shard on the node at once, so a pass cannot
jump between all rows of the store. Instead the pass order is two-level: a keyed permutation of
the store's shards ("blocks"), cut into *windows* of ``window`` consecutive blocks, and within
each window a keyed permutation of all of the window's rows. Pass positions ``[a_j, a_{j+1})``
belong to window ``j``, so while readers walk a window they need exactly its shards, and the next
window's shards are known in advance (the cache fetches them ahead and evicts the shard whose next
use is furthest away).

Like :class:`~lightning_tune_data.sources.permutation.KeyedPermutation`, the order is computed per
position, never stored: memory grows with the number of shards (a few integers each), not rows.
With ``window`` at least the number of shards there is one window, and the order is a full
shuffle of the store (a different one than the unwindowed order: the keys differ).
"""

from __future__ import annotations

import numpy as np

from lightning_tune_data.sources.permutation import KeyedPermutation, permutation_key

__all__ = ["ORDER_SHARDS", "ORDER_WINDOW", "WindowedPermutation"]

# Keys of the order a windowed store's saved position depends on.
ORDER_WINDOW = "shuffle_window"
ORDER_SHARDS = "shards"


class WindowedPermutation:
    """A bijection of ``[0, rows)`` that visits the store window by window.

    Args:
        shard_rows: rows of every shard, in store order.
        window: shards per window (at least 1).
        key: 64-bit key of the pass (see :func:`permutation_key`).
        shuffle: ``False`` visits the shards and their rows in store order (windows then only
            group consecutive shards).
    """

    def __init__(self, shard_rows: np.ndarray | list[int], window: int, key: int, shuffle: bool = True) -> None:
        rows = np.asarray(shard_rows, dtype=np.int64)
        if window < 1:
            raise ValueError(f"window must be >= 1 shard, got {window}.")
        self.key = int(key)
        self.shuffle = bool(shuffle)
        self.window = int(window)
        self.shard_starts = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
        self.num_items = int(self.shard_starts[-1])
        count = len(rows)
        self.block_order = KeyedPermutation(count, permutation_key(key, "blocks"), shuffle=self.shuffle)(np.arange(count))
        ordered_rows = rows[self.block_order]
        window_ends = np.cumsum(ordered_rows)[np.minimum(np.arange(self.window, count + self.window, self.window),
                                                         count) - 1]
        self.window_starts = np.concatenate([[0], window_ends]).astype(np.int64)
        self._inside: dict[int, tuple[np.ndarray, np.ndarray, KeyedPermutation]] = {}

    @property
    def num_windows(self) -> int:
        """Windows of a pass."""
        return len(self.window_starts) - 1

    def shards_of_window(self, window: int) -> np.ndarray:
        """The shards window ``window`` reads, in block order."""
        return self.block_order[window * self.window : (window + 1) * self.window]

    def window_of(self, positions: np.ndarray | int) -> np.ndarray | int:
        """The window of each position (``positions`` in ``[0, num_items)``)."""
        return np.searchsorted(self.window_starts, positions, side="right") - 1

    def shard_windows(self) -> np.ndarray:
        """The window of every shard (indexed by shard)."""
        windows = np.empty(len(self.block_order), dtype=np.int64)
        windows[self.block_order] = np.arange(len(self.block_order)) // self.window
        return windows

    def _window_parts(self, window: int) -> tuple[np.ndarray, np.ndarray, KeyedPermutation]:
        """Window ``window``'s shards, the cumulative rows of those shards, and its inner order."""
        parts = self._inside.get(window)
        if parts is None:
            shards = self.shards_of_window(window)
            sizes = self.shard_starts[shards + 1] - self.shard_starts[shards]
            inner = KeyedPermutation(int(sizes.sum()), permutation_key(self.key, "window", window), shuffle=self.shuffle)
            parts = (shards, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), inner)
            if len(self._inside) >= 4:  # readers are in one or two windows at a time
                self._inside.pop(next(iter(self._inside)))
            self._inside[window] = parts
        return parts

    def __call__(self, positions: np.ndarray | list[int]) -> np.ndarray:
        """Rows at ``positions`` (int64 array of the same shape)."""
        positions = np.asarray(positions, dtype=np.int64)
        if positions.size and (positions.min() < 0 or positions.max() >= self.num_items):
            raise IndexError(
                f"positions must lie in [0, {self.num_items}); got values from {positions.min()} to {positions.max()}."
            )
        rows = np.empty_like(positions)
        windows = np.asarray(self.window_of(positions))
        for window in np.unique(windows).tolist():
            chosen = windows == window
            shards, cumulative, inner = self._window_parts(window)
            local = inner(positions[chosen] - self.window_starts[window])
            which = np.searchsorted(cumulative, local, side="right") - 1
            rows[chosen] = self.shard_starts[shards[which]] + (local - cumulative[which])
        return rows

    def row(self, position: int) -> int:
        """The row at one position."""
        return int(self(np.array([position]))[0])
