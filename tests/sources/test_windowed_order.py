"""The two-level windowed order: a keyed bijection over blocks of rows that visits a store window by window."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_tune_data.sources.permutation import KeyedPermutation
from lightning_tune_data.sources.windowed_order import WindowedPermutation, window_rows

LAYOUTS = [  # (rows, block_rows, window_blocks)
    (120, 10, 3),
    (123, 10, 3),  # a short last block
    (17, 5, 1),  # one block per window
    (40, 7, 50),  # the window holds every block
    (9, 1, 1),  # blocks of one row
]


@pytest.mark.parametrize(("rows", "block", "window"), LAYOUTS)
def test_every_row_is_visited_exactly_once_per_pass(rows, block, window):
    order = WindowedPermutation(rows, block, window, key=7)
    assert sorted(order(np.arange(rows)).tolist()) == list(range(rows))


@pytest.mark.parametrize(("rows", "block", "window"), LAYOUTS)
def test_the_positions_of_a_window_read_only_that_windows_row_ranges(rows, block, window):
    order = WindowedPermutation(rows, block, window, key=11)
    for number in range(order.num_windows):
        positions = np.arange(order.window_starts[number], order.window_starts[number + 1])
        read = set(order(positions).tolist())
        ranges = order.ranges_of_window(number)
        assert read == {row for start, end in ranges for row in range(start, end)}
        assert all(order.window_of(int(p)) == number for p in positions)
    assert sum(len(order.blocks_of_window(w)) for w in range(order.num_windows)) == order.num_blocks


def test_block_windows_is_the_inverse_of_blocks_of_window():
    order = WindowedPermutation(100, 4, 3, key=1)
    windows = order.block_windows()
    for number in range(order.num_windows):
        assert all(windows[block] == number for block in order.blocks_of_window(number))


def test_the_order_is_a_function_of_the_rows_the_blocks_the_window_and_the_key_alone():
    first = WindowedPermutation(48, 6, 2, key=5)(np.arange(48))
    again = WindowedPermutation(48, 6, 2, key=5)(np.arange(48))
    assert np.array_equal(first, again)
    for other in (WindowedPermutation(48, 6, 2, key=6), WindowedPermutation(48, 4, 3, key=5),
                  WindowedPermutation(48, 6, 3, key=5)):
        assert not np.array_equal(first, other(np.arange(48)))
    assert window_rows({"block_rows": 6, "window_blocks": 2}) == 12


def test_positions_in_any_order_or_shape_give_the_same_rows_as_one_call():
    order = WindowedPermutation(34, 5, 2, key=3)
    everything = order(np.arange(34))
    shuffled = np.random.default_rng(0).permutation(34)
    assert np.array_equal(order(shuffled), everything[shuffled])
    assert order.row(17) == everything[17]


def test_without_shuffle_the_rows_are_read_in_order():
    order = WindowedPermutation(15, 4, 2, key=9, shuffle=False)
    assert order(np.arange(15)).tolist() == list(range(15))


def test_inside_a_window_consecutive_documents_come_from_different_blocks_as_in_a_full_shuffle():
    order = WindowedPermutation(1600, 100, 4, key=2)
    rows = order(np.arange(1600))
    same_block = np.mean(rows[1:] // 100 == rows[:-1] // 100)
    assert same_block < 0.5  # a window of 4 blocks mixes them: about 1 in 4 pairs share a block
    full = KeyedPermutation(1600, 2)(np.arange(1600))
    assert np.mean(full[1:] // 100 == full[:-1] // 100) < same_block


def test_out_of_range_positions_and_a_zero_window_are_refused():
    order = WindowedPermutation(4, 2, 1, key=0)
    with pytest.raises(IndexError, match=r"\[0, 4\)"):
        order([4])
    with pytest.raises(ValueError, match="must be >= 1"):
        WindowedPermutation(4, 2, 0, key=0)
