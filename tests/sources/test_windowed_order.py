"""The two-level windowed order: a keyed bijection that visits a store window by window."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_tune_data.sources.permutation import KeyedPermutation
from lightning_tune_data.sources.windowed_order import WindowedPermutation

LAYOUTS = [
    ([5, 7, 3, 9, 4, 6, 8, 2], 3),
    ([10] * 12, 4),
    ([4, 0, 6, 5, 0, 3], 2),  # empty shards (an empty task writes one)
    ([1], 1),
    ([3, 8, 2], 5),  # the window holds every shard
]


@pytest.mark.parametrize(("shard_rows", "window"), LAYOUTS)
def test_every_row_is_visited_exactly_once_per_pass(shard_rows, window):
    order = WindowedPermutation(shard_rows, window, key=7)
    rows = order(np.arange(sum(shard_rows)))
    assert sorted(rows.tolist()) == list(range(sum(shard_rows)))


@pytest.mark.parametrize(("shard_rows", "window"), LAYOUTS)
def test_the_positions_of_a_window_read_only_that_windows_shards(shard_rows, window):
    order = WindowedPermutation(shard_rows, window, key=11)
    starts = np.concatenate([[0], np.cumsum(shard_rows)])
    for number in range(order.num_windows):
        positions = np.arange(order.window_starts[number], order.window_starts[number + 1])
        shards = np.searchsorted(starts, order(positions), side="right") - 1
        assert set(shards.tolist()) <= set(order.shards_of_window(number).tolist())
        assert all(order.window_of(int(p)) == number for p in positions)
    assert sum(len(order.shards_of_window(w)) for w in range(order.num_windows)) == len(shard_rows)


def test_shard_windows_is_the_inverse_of_shards_of_window():
    order = WindowedPermutation([3] * 10, 3, key=1)
    windows = order.shard_windows()
    for number in range(order.num_windows):
        assert all(windows[shard] == number for shard in order.shards_of_window(number))


def test_the_order_is_a_function_of_the_key_alone():
    first = WindowedPermutation([6] * 8, 2, key=5)(np.arange(48))
    again = WindowedPermutation([6] * 8, 2, key=5)(np.arange(48))
    other = WindowedPermutation([6] * 8, 2, key=6)(np.arange(48))
    assert np.array_equal(first, again) and not np.array_equal(first, other)


def test_positions_in_any_order_or_shape_give_the_same_rows_as_one_call():
    order = WindowedPermutation([5, 7, 3, 9, 4, 6], 2, key=3)
    everything = order(np.arange(34))
    shuffled = np.random.default_rng(0).permutation(34)
    assert np.array_equal(order(shuffled), everything[shuffled])
    assert order.row(17) == everything[17]


def test_without_shuffle_the_store_is_read_in_order():
    order = WindowedPermutation([5, 7, 3], 2, key=9, shuffle=False)
    assert order(np.arange(15)).tolist() == list(range(15))


def test_inside_a_window_consecutive_documents_come_from_different_shards_as_in_a_full_shuffle():
    order = WindowedPermutation([100] * 16, 4, key=2)
    rows = order(np.arange(1600))
    same_shard = np.mean(rows[1:] // 100 == rows[:-1] // 100)
    assert same_shard < 0.5  # a window of 4 shards mixes them: about 1 in 4 pairs share a shard
    full = KeyedPermutation(1600, 2)(np.arange(1600))
    assert np.mean(full[1:] // 100 == full[:-1] // 100) < same_shard


def test_out_of_range_positions_and_a_zero_window_are_refused():
    order = WindowedPermutation([2, 2], 1, key=0)
    with pytest.raises(IndexError, match=r"\[0, 4\)"):
        order([4])
    with pytest.raises(ValueError, match="window must be >= 1"):
        WindowedPermutation([2, 2], 0, key=0)
