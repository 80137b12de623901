"""How a store read through the node cache is shuffled: its blocks and windows, and the disk they need.

A budgeted store's pass order (:mod:`lightning_tune_data.sources.windowed_order`) mixes *windows*
of ``W`` blocks of ``B`` rows each. ``B`` and ``W`` are chosen once, when a run starts, and saved
with its position: a resume reads the same order on any node, and whatever number of tasks
wrote the store. They are computed from what does not depend on how the store was cut into shards
(its rows and tokens, the run's ``shard_size``, the budget, ``shuffle_window``), except that a
window must fit the budget on the shards that actually hold it (:func:`window_need`).

Per store a reader keeps the window being read and the next one (fetched ahead): the shards
that hold their ``2·W`` blocks. :func:`window_need` bounds their bytes by the ``2·W`` blocks
whose shards are largest, so a budget that holds the need never waits on the reader itself.
The derived window is sized for all of the node's readers of the store (local ranks times
dataloader workers, :func:`windows_kept`), so that together they fit the budget.
"""

from __future__ import annotations

import math

import numpy as np

from lightning_tune_data.cache.sizes import human_size
from lightning_tune_data.keys import ORDER_BLOCK as _BLOCK
from lightning_tune_data.keys import ORDER_WINDOW as _WINDOW

__all__ = ["EDGE_SHARDS", "SHARDS_PER_BLOCK", "WINDOWS_KEPT", "WINDOWS_PER_BUDGET", "block_spans", "check_window",
           "pass_downloads", "plan_window", "window_need", "windows_kept"]

#: Without room for blocks of :data:`SHARDS_PER_BLOCK` shards, a window holds this share of the
#: budget (an eighth; one block of consecutive rows).
WINDOWS_PER_BUDGET = 8
#: Windows a reader keeps at once: the one being read and the next (fetched ahead).
WINDOWS_KEPT = 2
#: A block holds about this many ``shard_size`` of rows: small blocks let a window mix rows from
#: many places of the store, and each block's edges cut a shard that a pass may fetch twice.
SHARDS_PER_BLOCK = 2
#: ``shard_size`` a window counts per block for the shards its two edges cut (parts of two
#: shards, which come out up to about 1.5 ``shard_size``: they close past the size).
EDGE_SHARDS = 2.0


def windows_kept(readers: int) -> int:
    """Windows whose shards the node holds at once for ``readers`` readers of a store (ranks
    times dataloader workers): a reader keeps :data:`WINDOWS_KEPT`; several readers walk one pass
    together (each a stride of it), so while some have entered the next window others finish the
    last one: one window more."""
    return WINDOWS_KEPT + (1 if readers > 1 else 0)


def block_spans(shard_starts: np.ndarray, shard_sizes: np.ndarray, block_rows: int) -> np.ndarray:
    """Bytes of the shards each block of ``block_rows`` rows lies in (indexed by block).

    Args:
        shard_starts: every shard's first row, and the row count last.
        shard_sizes: every shard's bytes.
        block_rows: rows per block.
    """
    rows = int(shard_starts[-1])
    starts = np.arange(0, rows, block_rows, dtype=np.int64)
    ends = np.minimum(starts + block_rows, rows)
    first = np.searchsorted(shard_starts, starts, side="right") - 1
    last = np.searchsorted(shard_starts, ends - 1, side="right") - 1
    cumulative = np.concatenate([[0], np.cumsum(np.asarray(shard_sizes, dtype=np.int64))])
    return cumulative[last + 1] - cumulative[first]


def window_need(shard_starts: np.ndarray, shard_sizes: np.ndarray, order: dict[str, int]) -> int:
    """Bytes a reader keeps at most: the shards of a window and the next one (``2·W`` blocks),
    bounded by the blocks whose shards are largest."""
    spans = np.sort(block_spans(shard_starts, shard_sizes, int(order[_BLOCK])))[::-1]
    return int(spans[: WINDOWS_KEPT * int(order[_WINDOW])].sum())


def pass_downloads(shard_starts: np.ndarray, shard_sizes: np.ndarray, order: dict[str, int]) -> int:
    """Bytes a reader fetches per pass at most: every block's shards once, a shard cut by a
    block's edge once more (never more than the store once per window)."""
    spans = block_spans(shard_starts, shard_sizes, int(order[_BLOCK]))
    windows = -(-len(spans) // int(order[_WINDOW]))
    return int(min(spans.sum(), windows * int(np.sum(shard_sizes))))


def _row_bytes(rows: int, tokens: int, size: int) -> float:
    """Bytes of a row, from the store's rows and tokens (the same whatever the shard cut): its
    tokens times the bytes of a token (the power of two nearest the store's bytes per token)."""
    per_token = 2.0 ** round(math.log2(max(size / max(tokens, 1), 1.0)))
    return max(per_token * tokens / max(rows, 1), 1.0)


def plan_window(shard_rows: list[int], shard_sizes: list[int], tokens: int, share: int, configured: int | None,
                shard_bytes: int, description: str, sharers: int = 1, readers: int = 1) -> dict[str, int]:
    """The blocks and windows of a store read through ``share`` bytes of the node cache.

    Blocks hold about :data:`SHARDS_PER_BLOCK` ``shard_bytes`` of rows. Without ``configured``,
    a window holds as many blocks as the share holds for the node's ``readers``: the
    :func:`windows_kept` windows they hold at once, each block counted with the shards its edges
    cut (sized from ``shard_bytes``, so the plan does not depend on how the store was cut); fewer
    when the shards that really hold the blocks would not fit. A share too small for one such
    window gets one block of consecutive rows of an eighth of it (:data:`WINDOWS_PER_BUDGET`).

    Args:
        shard_rows, shard_sizes: every shard's rows and bytes, in row order.
        tokens: the store's tokens.
        share: the store's share of the node's ``cache_budget``.
        configured: ``shuffle_window``: rows a window mixes; ``None`` derives it.
        shard_bytes: the run's ``shard_size``.
        description: names the source in errors.
        sharers: train stores sharing the node's ``cache_budget`` (for messages).
        readers: processes of the node reading the store (local ranks times dataloader workers).

    Raises:
        ValueError: the budget cannot hold the window (a configured one, or one block).
    """
    rows = int(sum(shard_rows))
    row_bytes = _row_bytes(rows, tokens, int(sum(shard_sizes)))
    block = int(min(rows, max(1, SHARDS_PER_BLOCK * shard_bytes // row_bytes)))
    if configured is not None:
        if configured < 1:
            raise ValueError(f"{description}: shuffle_window must be >= 1 row, got {configured}.")
        block = min(block, int(configured))
        order = {_BLOCK: block, _WINDOW: max(1, round(configured / block))}
        check_window(shard_rows, shard_sizes, share, order, description, sharers, "or lower shuffle_window")
        return order
    readers = max(1, int(readers))
    kept = windows_kept(readers)
    edges = EDGE_SHARDS * shard_bytes  # the shards a block's edges cut
    windows = int(share // (kept * (block * row_bytes + edges)))
    if windows < 1:  # no room for blocks of shards: one block of consecutive rows
        windows, block = 1, min(block, max(1, int(share / WINDOWS_PER_BUDGET / row_bytes)))
    windows = min(windows, -(-rows // block))
    starts = np.concatenate([[0], np.cumsum(shard_rows)]).astype(np.int64)
    spans = np.cumsum(np.sort(block_spans(starts, np.asarray(shard_sizes, dtype=np.int64), block))[::-1])
    fitting = int(np.searchsorted(spans, share, side="right")) // kept  # windows whose blocks fit
    order = {_BLOCK: block, _WINDOW: max(1, min(windows, fitting))}
    check_window(shard_rows, shard_sizes, share, order, description, sharers,
                 "or prepare the store with a smaller shard_size")
    return order


def check_window(shard_rows: list[int], shard_sizes: list[int], share: int, order: dict[str, int], description: str,
                 sharers: int = 1, fix: str = "or lower shuffle_window") -> None:
    """Refuse a window the budget cannot hold, naming the budget needed.

    Args:
        shard_rows, shard_sizes: every shard's rows and bytes.
        share: the store's share of the node's ``cache_budget``.
        order: the blocks and windows.
        description: names the source.
        sharers: train stores sharing the node's ``cache_budget``.
        fix: the other way out, after raising the budget.

    Raises:
        ValueError: the shards of a window and the next one may take more than ``share``.
    """
    starts = np.concatenate([[0], np.cumsum(shard_rows)]).astype(np.int64)
    need = window_need(starts, np.asarray(shard_sizes, dtype=np.int64), order)
    if need <= share:
        return
    size = human_size if human_size(share) != human_size(need) else (lambda count: f"{count:,} bytes")
    shared = (f" (cache_budget is the node's, shared by {sharers} train stores: {size(share)} each)"
              if sharers > 1 else "")
    rows = int(order[_BLOCK]) * int(order[_WINDOW])
    raise ValueError(
        f"{description}: cache_budget {size(share * sharers)} cannot hold a shuffle window of {rows:,} rows "
        f"({order[_WINDOW]} block{'s' if order[_WINDOW] != 1 else ''} of {order[_BLOCK]:,} rows) and the next window "
        "fetched ahead: their shards take up "
        f"to {size(need)}{shared}. Raise cache_budget to at least {size(need * sharers)}, {fix}."
    )
