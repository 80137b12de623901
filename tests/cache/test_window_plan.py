"""How a budgeted store's blocks and windows are chosen, and the disk a window needs."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_tune_data.cache.window_plan import (
    block_spans,
    check_window,
    pass_downloads,
    plan_window,
    window_need,
    windows_kept,
)
from lightning_tune_data.sources.windowed_order import WindowedPermutation

# One store of 1,000 rows of 25 int32 tokens (100 bytes a row, 100,000 bytes), cut two ways.
ROWS, TOKENS = 1000, 25_000
ONE_TASK = ([100] * 10, [10_000] * 10)  # rows and bytes of each shard


def four_tasks() -> tuple[list[int], list[int]]:
    """The same rows cut by four tasks of 250 rows: two full shards and a short last one each."""
    rows = [100, 100, 50] * 4
    return rows, [r * 100 + 60 for r in rows]  # and a little more per file


def test_block_spans_are_the_bytes_of_the_shards_each_block_lies_in():
    starts = np.array([0, 100, 200, 300])
    sizes = np.array([10, 20, 40])
    assert block_spans(starts, sizes, 100).tolist() == [10, 20, 40]
    assert block_spans(starts, sizes, 150).tolist() == [30, 60]  # [0, 150) in shards 0-1; [150, 300) in 1-2
    assert window_need(starts, sizes, {"block_rows": 50, "window_blocks": 1}) == 80  # the two largest blocks' shards
    assert pass_downloads(starts, sizes, {"block_rows": 100, "window_blocks": 3}) == 70


def test_the_derived_plan_is_the_same_whatever_the_shard_cut():
    for share in (40_000, 60_000, 80_000, 160_000):
        one = plan_window(*ONE_TASK, TOKENS, share, None, 10_000, "train/a")
        four = plan_window(*four_tasks(), TOKENS, share, None, 10_000, "train/a")
        assert one == four, share
    assert plan_window(*ONE_TASK, TOKENS, 80_000, None, 10_000, "train/a") == {"block_rows": 200, "window_blocks": 1}


def test_a_larger_budget_gives_a_larger_window_of_blocks_of_about_two_shard_sizes():
    plan = plan_window([100] * 100, [10_000] * 100, 250_000, 800_000, None, 10_000, "train/a")
    assert plan == {"block_rows": 200, "window_blocks": 10}  # two windows of 10 blocks (20 KB + edges) fit 800 KB
    plan = plan_window([100] * 1000, [10_000] * 1000, 2_500_000, 8_000_000, None, 10_000, "train/a")
    assert plan == {"block_rows": 200, "window_blocks": 100}


def test_a_window_at_a_quarter_of_the_store_mixes_rows_from_several_places_of_it():
    rows, sizes = [100] * 100, [10_000] * 100
    plan = plan_window(rows, sizes, 250_000, 250_000, None, 10_000, "train/a")
    assert plan["window_blocks"] >= 3  # not one block of consecutive rows
    order = WindowedPermutation(sum(rows), plan["block_rows"], plan["window_blocks"], key=7)
    for window in range(order.num_windows - 1):
        ranges = order.ranges_of_window(window)
        assert len(ranges) >= 3 and len({start // 1000 for start, _ in ranges}) >= 2  # apart in the store
    starts = np.concatenate([[0], np.cumsum(rows)])
    assert window_need(starts, np.array(sizes), plan) <= 250_000
    assert pass_downloads(starts, np.array(sizes), plan) <= 1.5 * sum(sizes)


@pytest.mark.parametrize("readers", [1, 2, 4, 8])
@pytest.mark.parametrize("share", [150_000, 250_000, 800_000])
def test_the_windows_of_all_the_nodes_readers_fit_the_budget(readers, share):
    rows, sizes = [100] * 100, [10_000 + 1_000 * (i % 5) for i in range(100)]  # uneven shards
    plan = plan_window(rows, sizes, 250_000, share, None, 10_000, "train/a", readers=readers)
    starts = np.concatenate([[0], np.cumsum(rows)])
    spans = np.sort(block_spans(starts, np.array(sizes), plan["block_rows"]))[::-1]
    assert spans[: windows_kept(readers) * plan["window_blocks"]].sum() <= share  # readers a window apart
    if readers > 1:
        assert windows_kept(readers) == 3
        alone = plan_window(rows, sizes, 250_000, share, None, 10_000, "train/a")
        assert plan["block_rows"] == alone["block_rows"] and plan["window_blocks"] <= alone["window_blocks"]


def test_a_configured_window_in_rows_is_kept_when_the_budget_holds_it():
    assert plan_window(*ONE_TASK, TOKENS, 100_000, 800, 10_000, "train/a") == {"block_rows": 200, "window_blocks": 4}
    assert plan_window(*ONE_TASK, TOKENS, 60_000, 200, 10_000, "train/a") == {"block_rows": 200, "window_blocks": 1}
    assert plan_window(*ONE_TASK, TOKENS, 60_000, 30, 10_000, "train/a") == {"block_rows": 30, "window_blocks": 1}


def test_a_budget_that_cannot_hold_the_window_names_the_budget_needed():
    with pytest.raises(ValueError) as error:
        plan_window(*ONE_TASK, TOKENS, 50_000, 300, 10_000, "train/a")
    assert str(error.value) == (
        "train/a: cache_budget 50.0 KB cannot hold a shuffle window of 400 rows (2 blocks of 200 rows) and the next "
        "window fetched ahead: their shards take up to 80.0 KB. Raise cache_budget to at least 80.0 KB, or lower "
        "shuffle_window.")
    with pytest.raises(ValueError, match=r"shared by 2 train stores: 15.0 KB each.*at least 80.0 KB, or prepare the "
                                         r"store with a smaller shard_size"):
        plan_window(*ONE_TASK, TOKENS, 15_000, None, 10_000, "train/a", sharers=2)
    with pytest.raises(ValueError, match="shuffle_window must be >= 1 row, got 0"):
        plan_window(*ONE_TASK, TOKENS, 50_000, 0, 10_000, "train/a")
    check_window(*ONE_TASK, 20_000, {"block_rows": 50, "window_blocks": 1}, "train/a")  # two blocks in two shards
