"""KeyedPermutation: a computed (never stored) shuffle with the quality of a true random permutation."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_tune_data.sources.permutation import KeyedPermutation, name_key, permutation_key


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 16, 17, 63, 64, 65, 1000, 4097, 65_537])
def test_one_pass_is_a_permutation_of_every_row(n):
    rows = KeyedPermutation(n, permutation_key(7, "web", 0))(np.arange(n))
    assert sorted(rows.tolist()) == list(range(n))


def test_the_next_pass_and_another_seed_give_other_orders():
    n = 10_000
    order = {key: KeyedPermutation(n, permutation_key(*key))(np.arange(n)) for key in [(7, "web", 0), (7, "web", 1), (8, "web", 0), (7, "code", 0)]}
    first = order[(7, "web", 0)]
    for key, other in order.items():
        if key != (7, "web", 0):
            assert np.mean(first == other) < 0.01  # as unrelated as two random permutations


def test_any_position_can_be_evaluated_alone_in_constant_memory():
    n = 200_000_000
    permutation = KeyedPermutation(n, permutation_key(1, "big", 3))
    positions = np.array([0, 1, 123_456_789, n - 1])
    rows = permutation(positions)
    assert all(0 <= r < n for r in rows.tolist())
    assert [permutation.row(int(p)) for p in positions] == rows.tolist()
    with pytest.raises(IndexError):
        permutation([n])


def test_windows_of_consecutive_outputs_are_spread_over_the_whole_source():
    n = 100_000
    rows = KeyedPermutation(n, permutation_key(3, "web", 0))(np.arange(n))
    # neighbouring outputs are unrelated: no correlation, no locality
    assert abs(np.corrcoef(rows[:-1], rows[1:])[0, 1]) < 0.02
    assert np.median(np.abs(np.diff(rows))) > n / 5  # a true random permutation: about n * (1 - 1/sqrt(2)) = 0.29 n
    # every window of 1,000 consecutive outputs covers the source evenly: chi-square over 10 equal buckets
    chi2 = []
    for window in rows.reshape(-1, 1000):
        counts = np.bincount(window * 10 // n, minlength=10)
        chi2.append(((counts - 100) ** 2 / 100).sum())
    assert 6 < np.mean(chi2) < 12  # 9 degrees of freedom: mean 9 for uniform draws
    small = rows.reshape(-1, 16)
    assert np.mean(small.max(axis=1) - small.min(axis=1)) > 0.8 * n  # 16 outputs span ~88% of the source


def test_shuffle_false_is_the_identity():
    assert KeyedPermutation(10, 123, shuffle=False)(np.arange(10)).tolist() == list(range(10))


def test_keys_are_pinned_values_so_orders_and_draws_survive_processes_and_versions():
    # Saved states describe positions in these orders: a key that changed would resume other rows.
    assert permutation_key(7, "web", 0) == 5448896274540779035 != permutation_key(7, "web", 1)
    assert name_key("web") == 4132920907 != name_key("code")
    assert 0 <= name_key("a rather long source name") < 2**32
