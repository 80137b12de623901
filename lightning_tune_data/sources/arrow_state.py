"""``ArrowSourceState``: where one shard of an ``ArrowSource`` is, what it skipped, and its saved forms.

The position is a :class:`~lightning_tune_data.sources.pass_order.ShardPasses` walk (a handful of
integers) and the counters are plain ints, so the state is the same size at any step. A shard's
walk is built fresh, restored from that shard's own state, or split from what every shard of
another layout left unread (an elastic resume), on first use in the process that reads.

Reading advances the walk lazily: while it hands out the documents of a block, iteration only
counts them in :attr:`ArrowSourceState.cursor`, and :meth:`ArrowSourceState.settle` applies the
count before anything looks at the position, so the state seen at any moment describes exactly
the documents read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_tune_data.distributed import current_shard
from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.document_block import DocumentBlock
from lightning_tune_data.sources.pass_order import ShardPasses, merge_remaining, split_remaining
from lightning_tune_data.sources.windowed_order import window_rows
from lightning_tune_data.sources.source_state import SourceCounters, shard_mismatch_error

__all__ = ["ArrowSourceState", "OrderHolder", "saved_orders"]

# State keys.
_WALK = "walk"
_COUNTERS = "counters"
_ORDER = "order"


class OrderHolder:
    """What a source's pass order depends on beyond the seed and rows, and how a resume adopts a
    checkpoint's (the default: the full shuffle, which nothing else can be adopted into).

    :class:`~lightning_tune_data.sources.arrow_rows.ArrowRows` is one.
    """

    def order_state(self) -> dict[str, int] | None:
        """The order now (``None``: the full shuffle)."""
        return None

    def adopt_order(self, order: dict[str, int] | None) -> None:
        """Read in ``order`` from now on.

        Raises:
            ValueError: this reader cannot read in ``order``.
        """
        if order is not None:
            raise ValueError(f"this source cannot read the windowed order {order}")


def saved_orders(state: Any) -> dict[str, dict[str, int] | None]:
    """The pass order of every source in a saved stream state (any nesting: a mixer's, a
    packer's), by source name; ``None`` for a source saved in the full shuffle.

    Args:
        state: a train stream's state, or a list of them (one per shard).
    """
    found: dict[str, dict[str, int] | None] = {}
    stack = [state]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            for key, value in item.items():
                if isinstance(value, dict) and _WALK in value and _COUNTERS in value:
                    found.setdefault(str(key), value.get(_ORDER))
                else:
                    stack.append(value)
    return found


class ArrowSourceState:
    """The walk, the counters and the lazy cursor of one source shard.

    Args:
        source: the source's name (the key of its state).
        num_rows: rows of the source (saved, and checked when a state is loaded).
        settings: the run's settings (``rank`` and ``world_size`` place the shard; ``max_seq_len``
            and ``overlong`` tell what was skipped in a block).
        counters: the source's counters (restored in place when a state is loaded).
        order: what the pass order depends on beyond the seed and rows (a windowed order's blocks
            and windows): saved, and adopted from a loaded state (default: the full shuffle).
    """

    def __init__(self, source: str, num_rows: int, settings: StreamSettings, counters: SourceCounters,
                 order: OrderHolder | None = None) -> None:
        self.source = source
        self.num_rows = num_rows
        self._order = order if order is not None else OrderHolder()
        self.settings = settings
        self.counters = counters
        #: ``[plan, documents of its block read, of them applied to the plan]`` while a block is read.
        self.cursor: list[Any] | None = None
        self._walk: ShardPasses | None = None
        self._remaining: dict[str, Any] | None = None  # set by load_global, split on first use

    @property
    def order(self) -> dict[str, int] | None:
        """The pass order saved with the position (``None``: the full shuffle)."""
        return self._order.order_state()

    def __getstate__(self) -> dict[str, Any]:
        self.settle()
        state = self.__dict__.copy()
        state["cursor"] = None
        return state

    def settle(self) -> None:
        """Advance the plan past the documents iteration has read from its current block."""
        cursor = self.cursor
        if cursor is not None and cursor[1] > cursor[2]:
            cursor[0].advance(cursor[1] - cursor[2])
            cursor[2] = cursor[1]

    def walk(self) -> ShardPasses:
        """This shard's walk: split from a loaded global state on first use, else kept or fresh.

        Raises:
            ValueError: the walk was restored for another shard.
        """
        shard = current_shard(self.settings.rank, self.settings.world_size)
        if self._remaining is not None:
            remaining, self._remaining = self._remaining, None
            self._walk = split_remaining(remaining[_WALK], self.num_rows, shard.num_shards, shard.shard_id)
            self.counters.load_state_dict(remaining[_COUNTERS] if shard.shard_id == 0 else {})
        elif self._walk is None:
            self._walk = ShardPasses(self.num_rows, shard.num_shards, shard.shard_id)
        elif (self._walk.num_shards, self._walk.shard_id) != (shard.num_shards, shard.shard_id):
            raise shard_mismatch_error(self.source, self._walk.shard_id, self._walk.num_shards, shard)
        return self._walk

    def state_dict(self) -> dict[str, Any]:
        """``{source: {"walk": ..., "counters": ...}}`` after the documents read so far."""
        return self.snapshot()()

    def snapshot(self) -> Callable[[], dict[str, Any]]:
        """A record of the position now, taken in a few microseconds; calling it builds
        :meth:`state_dict`'s result for that position."""
        self.settle()
        walk, counters, name, order = self.walk().snapshot(), self.counters.state_dict(), self.source, self.order
        if order is not None:
            return lambda: {name: {_WALK: walk(), _COUNTERS: dict(counters), _ORDER: dict(order)}}
        return lambda: {name: {_WALK: walk(), _COUNTERS: dict(counters)}}

    def load_state_dict(self, own: dict[str, Any]) -> None:
        """Continue from this shard's own saved state.

        Args:
            own: the source's entry of a :meth:`state_dict` result.

        Raises:
            ValueError: the state was written for other data or by another shard.
        """
        self._check_rows(own[_WALK])
        self._check_order(own)
        walk = ShardPasses.from_state(own[_WALK])
        shard = current_shard(self.settings.rank, self.settings.world_size)
        if (walk.num_shards, walk.shard_id) != (shard.num_shards, shard.shard_id):
            raise shard_mismatch_error(self.source, walk.shard_id, walk.num_shards, shard)
        self._walk = walk
        self._remaining = None
        self.cursor = None
        self.counters.load_state_dict(own[_COUNTERS])

    def merge(self, owns: list[dict[str, Any]]) -> dict[str, Any]:
        """What every shard of a layout left unread, and their summed counters (namespaced).

        Args:
            owns: the source's entry of every old shard's state.
        """
        for own in owns:
            self._check_rows(own[_WALK])
        orders = {repr(own.get(_ORDER)) for own in owns}
        if len(orders) > 1:
            raise ValueError(f"Source '{self.source}': the checkpoint's shards read in different orders ({sorted(orders)}); "
                             "the data state is corrupt.")
        self._check_order(owns[0])
        merged = {
            _WALK: merge_remaining([own[_WALK] for own in owns], self.source),
            _COUNTERS: SourceCounters.total([own[_COUNTERS] for own in owns]).state_dict(),
        }
        if self.order is not None:
            merged[_ORDER] = dict(self.order)
        return {self.source: merged}

    def load_global(self, own: dict[str, Any]) -> None:
        """Continue from a :meth:`merge` result: this shard takes its share on first use.

        Args:
            own: the source's entry of the merged state.
        """
        self._check_order(own)
        self._remaining = own
        self._walk = None
        self.cursor = None

    def after_block(self, block: DocumentBlock, documents: int) -> dict[str, Any]:
        """The state right after the first ``documents`` documents of ``block``; the rows read for
        the block after that document are unread again in it.

        Args:
            block: a block this source read.
            documents: how many of the block's documents have been used (0 to all of them).
        """
        own = block.start_state[self.source]
        order = {_ORDER: own[_ORDER]} if _ORDER in own else {}
        if documents == 0:
            return {self.source: {_WALK: own[_WALK], _COUNTERS: dict(own[_COUNTERS]), **order}}
        read = int(block.kept[documents - 1]) + 1  # rows read up to and including that document
        empty, over = block.skipped_through(read, self.settings.max_seq_len)
        counters = dict(own[_COUNTERS])
        counters["empty_skipped"] += empty
        if over:
            counters["overlong_dropped" if self.settings.overlong == "drop" else "overlong_truncated"] += over
        walk = ShardPasses.state_advanced(own[_WALK], read)
        return {self.source: {_WALK: walk, _COUNTERS: counters, **order}}

    def _check_order(self, own: dict[str, Any]) -> None:
        """Adopt the pass order a position was saved in: the same position in another order would
        mean other rows.

        Raises:
            ValueError: this node cannot read that order (its budget cannot hold the window; a full
                shuffle saved for a store this node reads through its budget).
        """
        saved = own.get(_ORDER)
        if saved == self.order:
            return
        try:
            self._order.adopt_order(saved)
        except ValueError as error:
            what = "the full shuffle" if saved is None else f"shuffle windows of {window_rows(saved):,} rows"
            raise ValueError(f"Source '{self.source}': the checkpoint's position is in {what}, which this run "
                             f"cannot read: {error}") from None

    def _check_rows(self, walk_state: dict[str, Any]) -> None:
        """Refuse a walk saved over another number of rows: its positions would mean other rows."""
        saved = int(walk_state["num_rows"])
        if saved != self.num_rows:
            raise ValueError(
                f"Source '{self.source}': the checkpoint was written for {saved} rows but the cache now has "
                f"{self.num_rows}. The data changed, so the saved position means nothing; restore the original "
                "data files, or resume with `resume_data_state: false` to start the data from the beginning."
            )
