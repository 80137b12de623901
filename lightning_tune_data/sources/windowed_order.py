"""``WindowedPermutation``: a shuffle that a bounded node cache can serve, whatever the shard cut.

A store read through a byte budget cannot have every shard on the node at once, so a pass cannot
jump between all rows of the store. Instead the pass order is two-level, over fixed-size *blocks
of rows* (rows ``[i·B, (i+1)·B)``, the last block shorter): a keyed permutation of the blocks, cut
into *windows* of ``W`` consecutive blocks, and within each window a keyed permutation of all of
the window's rows. Pass positions ``[a_j, a_{j+1})`` belong to window ``j``, so while readers walk
a window they need exactly the shards that hold its blocks, and the next window's are known in
advance (the cache fetches them ahead and evicts the shard whose next use is furthest away).

The order depends on the rows, the seed, ``B`` and ``W`` only, never on how the store was cut
into shards: a store written by 1 or by 64 tasks gives the same order, and a run saves ``B`` and
``W`` with its position (:data:`ORDER_BLOCK`, :data:`ORDER_WINDOW`) so that a resume reads the
same order on any node. Like
:class:`~lightning_tune_data.sources.permutation.KeyedPermutation`, the order is computed per
position, never stored: memory grows with the number of blocks (one integer each), not rows.
"""

from __future__ import annotations

import numpy as np

from lightning_tune_data.keys import ORDER_BLOCK, ORDER_WINDOW
from lightning_tune_data.sources.permutation import KeyedPermutation, permutation_key

__all__ = ["WindowedPermutation", "window_rows"]


def window_rows(order: dict[str, int]) -> int:
    """Rows of a window of ``order`` (``{ORDER_BLOCK: B, ORDER_WINDOW: W}``): ``B·W``."""
    return int(order[ORDER_BLOCK]) * int(order[ORDER_WINDOW])


class WindowedPermutation:
    """A bijection of ``[0, num_rows)`` that visits the rows window by window.

    Args:
        num_rows: rows of the source.
        block_rows: rows per block (``B``, at least 1).
        window_blocks: blocks per window (``W``, at least 1).
        key: 64-bit key of the pass (see :func:`permutation_key`).
        shuffle: ``False`` visits the blocks and their rows in row order.
    """

    def __init__(self, num_rows: int, block_rows: int, window_blocks: int, key: int, shuffle: bool = True) -> None:
        if block_rows < 1 or window_blocks < 1:
            raise ValueError(f"block_rows and window_blocks must be >= 1, got {block_rows} and {window_blocks}.")
        self.key = int(key)
        self.shuffle = bool(shuffle)
        self.num_items = int(num_rows)
        self.block_rows = int(block_rows)
        self.window = int(window_blocks)
        count = -(-self.num_items // self.block_rows)
        self.num_blocks = count
        self.block_order = KeyedPermutation(count, permutation_key(key, "blocks"), shuffle=self.shuffle)(np.arange(count))
        ordered_rows = self._block_sizes(self.block_order)
        ends = np.minimum(np.arange(self.window, count + self.window, self.window), count) - 1
        self.window_starts = np.concatenate([[0], np.cumsum(ordered_rows)[ends] if count else []]).astype(np.int64)
        self._inside: dict[int, tuple[np.ndarray, np.ndarray, KeyedPermutation]] = {}

    def _block_sizes(self, blocks: np.ndarray) -> np.ndarray:
        starts = blocks * self.block_rows
        return np.minimum(starts + self.block_rows, self.num_items) - starts

    @property
    def num_windows(self) -> int:
        """Windows of a pass."""
        return len(self.window_starts) - 1

    def blocks_of_window(self, window: int) -> np.ndarray:
        """The blocks window ``window`` reads, in block order."""
        return self.block_order[window * self.window : (window + 1) * self.window]

    def ranges_of_window(self, window: int) -> list[tuple[int, int]]:
        """The row ranges ``[start, end)`` window ``window`` reads (one per block)."""
        starts = self.blocks_of_window(window) * self.block_rows
        return [(start, min(start + self.block_rows, self.num_items)) for start in starts.tolist()]

    def window_of(self, positions: np.ndarray | int) -> np.ndarray | int:
        """The window of each position (``positions`` in ``[0, num_items)``)."""
        return np.searchsorted(self.window_starts, positions, side="right") - 1

    def block_windows(self) -> np.ndarray:
        """The window of every block (indexed by block)."""
        windows = np.empty(self.num_blocks, dtype=np.int64)
        windows[self.block_order] = np.arange(self.num_blocks) // self.window
        return windows

    def _window_parts(self, window: int) -> tuple[np.ndarray, np.ndarray, KeyedPermutation]:
        """Window ``window``'s first rows of its blocks, their cumulative rows, and its inner order."""
        parts = self._inside.get(window)
        if parts is None:
            blocks = self.blocks_of_window(window)
            sizes = self._block_sizes(blocks)
            inner = KeyedPermutation(int(sizes.sum()), permutation_key(self.key, "window", window), shuffle=self.shuffle)
            parts = (blocks * self.block_rows, np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64), inner)
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
            starts, cumulative, inner = self._window_parts(window)
            local = inner(positions[chosen] - self.window_starts[window])
            which = np.searchsorted(cumulative, local, side="right") - 1
            rows[chosen] = starts[which] + (local - cumulative[which])
        return rows

    def row(self, position: int) -> int:
        """The row at one position."""
        return int(self(np.array([position]))[0])
