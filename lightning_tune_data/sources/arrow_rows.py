"""``ArrowRows``: the rows of a cached Arrow table, in the order a shard visits them.

The table's ``input_ids`` (and optional ``loss_mask``) columns are opened lazily, in the process
that reads (a dataloader worker, usually), and never pickled. Pass ``e`` visits positions in the
order of the keyed permutation of ``(seed, source name, e)``; the rows of a pass's next positions
are computed in bulk, ``_ROWS_AHEAD`` at a time, and kept until they are visited.

A store read through the node cache (a :class:`~lightning_tune_data.cache.cached_store.CachedStore`)
is opened shard by shard, and its passes follow the two-level windowed order
(:mod:`~lightning_tune_data.sources.windowed_order`) that the cache can serve; as the reader walks
it, :class:`~lightning_tune_data.sources.sharded_column.WindowReads` tells the cache what to keep
and fetch ahead. The order is the run's: a resume adopts the checkpoint's
(:meth:`ArrowRows.adopt_order`), also for a store this node reads whole.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from lightning_tune_data.keys import EPOCH, INPUT_IDS, LOSS_MASK, SOURCE, SOURCE_ROW
from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.arrow_columns import ListColumn, arrow_table
from lightning_tune_data.sources.arrow_state import OrderHolder
from lightning_tune_data.sources.pass_order import PassPlan
from lightning_tune_data.sources.permutation import KeyedPermutation, permutation_key
from lightning_tune_data.sources.sharded_column import ShardedColumn, WindowReads
from lightning_tune_data.keys import ORDER_BLOCK, ORDER_WINDOW
from lightning_tune_data.sources.windowed_order import WindowedPermutation

__all__ = ["ArrowRows"]

#: Positions mapped to rows per vectorised permutation call (kept until visited: 128 KiB). A call
#: costs mostly its fixed NumPy steps (cycle-walking repeats the cipher on ever fewer positions), so
#: 16,384 at a time costs ~4 us per 56 rows against ~7-11 us at 4,096.
_ROWS_AHEAD = 16384


class ArrowRows(OrderHolder):
    """The columns of one source's table, and the rows of a pass's upcoming positions.

    Args:
        dataset: a ``datasets.Dataset`` (memory-mapped cache) or ``pyarrow.Table`` with an
            ``input_ids`` list column and optionally a ``loss_mask`` list column.
        source: the source's name (permutation key and error messages).
        settings: the run's settings (``seed`` keys the permutations).
        shuffle: permute the rows every pass; ``False`` keeps file order.

    Raises:
        ValueError: the dataset has no rows.
    """

    def __init__(self, dataset: Any, source: str, settings: StreamSettings, shuffle: bool) -> None:
        self.dataset = dataset
        self.source = source
        self.settings = settings
        self.shuffle = shuffle
        self.num_rows = len(dataset) if not isinstance(dataset, pa.Table) else dataset.num_rows
        if self.num_rows == 0:
            raise ValueError(f"Source '{source}' has no rows; check its data files and filters.")
        #: The windowed order's blocks and windows (``None``: the full shuffle).
        self.order: dict[str, int] | None = dict(dataset.order) if self.windowed else None
        # Built lazily in the process that reads; dropped when pickled.
        self.input_ids: ListColumn | None = None
        self.loss_mask: ListColumn | None = None
        self._permutations: dict[int, KeyedPermutation | WindowedPermutation] = {}
        self._window_reads: WindowReads | None = None
        self._rows_ahead: tuple[PassPlan, int, np.ndarray] | None = None  # (plan, its taken count, rows)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["input_ids"] = state["loss_mask"] = None
        state["_permutations"] = {}
        state["_window_reads"] = None
        state["_rows_ahead"] = None
        return state

    def open(self) -> None:
        """Open the columns (once per process).

        Raises:
            KeyError: the table has no ``input_ids`` column.
        """
        if self.input_ids is not None:
            return
        if self.windowed:
            self.input_ids = ShardedColumn(self.dataset, INPUT_IDS, self.source)
            if LOSS_MASK in self.dataset.columns:
                self.loss_mask = ShardedColumn(self.dataset, LOSS_MASK, self.source)
            columns = [column for column in (self.input_ids, self.loss_mask) if column is not None]
            self._window_reads = WindowReads(self.dataset, self._permutation, columns)
            return
        table = arrow_table(self.dataset)
        if INPUT_IDS not in table.column_names:
            raise KeyError(
                f"Source '{self.source}': the cached dataset has no '{INPUT_IDS}' column (columns: "
                f"{table.column_names}). The preprocess function must return '{INPUT_IDS}'."
            )
        self.input_ids = ListColumn(table.column(INPUT_IDS), INPUT_IDS, self.source)
        if LOSS_MASK in table.column_names:
            self.loss_mask = ListColumn(table.column(LOSS_MASK), LOSS_MASK, self.source)

    @property
    def windowed(self) -> bool:
        """Whether the rows are read shard by shard through the node cache, window by window."""
        return hasattr(self.dataset, "open_shard")

    def order_state(self) -> dict[str, int] | None:
        """What the pass order depends on beyond the seed and rows (saved with the position):
        the blocks and windows of a windowed order, ``None`` for the full shuffle."""
        return None if self.order is None else dict(self.order)

    def adopt_order(self, order: dict[str, int] | None) -> None:
        """Read the passes in ``order`` (a checkpoint's): a windowed order on any store (a store read
        shard by shard checks that its budget holds the window), the full shuffle only on a store
        read whole.

        Raises:
            ValueError: the node's budget cannot hold the order (naming the budget needed).
        """
        order = None if order is None else {ORDER_BLOCK: int(order[ORDER_BLOCK]), ORDER_WINDOW: int(order[ORDER_WINDOW])}
        if order == self.order:
            return
        if self.windowed:
            self.dataset.adopt_order(order)
        self.order = order
        self._permutations = {}
        self._rows_ahead = None
        if self._window_reads is not None:
            self._window_reads.forget_position()

    def take_released(self) -> set[int]:
        """The shards a windowed store's reader let go of since the last call (empty otherwise)."""
        reads = self._window_reads
        return set() if reads is None else reads.take_released()

    def copied_out(self) -> None:
        """The reader copied out what it held of the shards :meth:`take_released` gave: their
        mappings go (no-op for other stores)."""
        if self._window_reads is not None:
            self._window_reads.copied_out()

    def _permutation(self, epoch: int) -> KeyedPermutation | WindowedPermutation:
        """The order of pass ``epoch`` (the latest two passes' are kept)."""
        permutation = self._permutations.get(epoch)
        if permutation is None:
            key = permutation_key(self.settings.seed, self.source, epoch)
            if self.order is not None:
                permutation = WindowedPermutation(self.num_rows, self.order[ORDER_BLOCK], self.order[ORDER_WINDOW], key,
                                                  self.shuffle)
            else:
                permutation = KeyedPermutation(self.num_rows, key, shuffle=self.shuffle)
            self._permutations = {**{e: p for e, p in self._permutations.items() if e in (epoch - 1, epoch + 1)},
                                  epoch: permutation}
        return permutation

    def upcoming(self, plan: PassPlan, limit: int) -> np.ndarray:
        """Rows of the plan's next up to ``limit`` positions, without advancing it.

        The permutation is evaluated for ``_ROWS_AHEAD`` positions at a time and kept until they
        are visited: one vectorised call per few thousand documents instead of one per block.

        Args:
            plan: the shard's plan of the pass being read.
            limit: the most rows returned.
        """
        cached, taken = self._rows_ahead, plan.taken
        if self._window_reads is not None and not plan.done:  # a read never spans two windows
            limit = self._window_reads.moved_to(plan.epoch, plan.upcoming(limit))
        if cached is None or cached[0] is not plan or not cached[1] <= taken < cached[1] + len(cached[2]):
            cached = self._rows_ahead = (plan, taken, self._permutation(plan.epoch)(plan.upcoming(_ROWS_AHEAD)))
        offset = taken - cached[1]
        return cached[2][offset : offset + limit]

    def document(self, row: int, epoch: int) -> dict[str, Any]:
        """Row ``row`` as a document sample of pass ``epoch`` (zero-copy views; columns open).

        Args:
            row: the row.
            epoch: the pass it is read for.
        """
        sample: dict[str, Any] = {INPUT_IDS: self.input_ids.row(row), SOURCE: self.source, EPOCH: epoch, SOURCE_ROW: row}
        if self.loss_mask is not None:
            sample[LOSS_MASK] = self.loss_mask.row(row).astype(bool, copy=False)
        return sample
