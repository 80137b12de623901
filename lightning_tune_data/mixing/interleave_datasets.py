"""Weighted interleaving of plain iterables: a framework-agnostic generator with no saved state.

:func:`interleave_datasets` mixes any iterables (lists, generators, other libraries' streams) by
``random.Random`` choice, or round-robin without probabilities, for code that needs the mix but
not the exact resume of :class:`~lightning_tune_data.mixing.interleave.InterleavedDataset`.
Plain iterables cannot be restarted, so only the finite stopping strategies apply.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Iterator

from lightning_tune_data.keys import STOPPING_STRATEGIES, StoppingStrategy

__all__ = ["interleave_datasets", "FINITE_STOPPING_STRATEGIES"]

#: The stopping strategies of a mix of plain iterables: every one but ``"infinite"``.
FINITE_STOPPING_STRATEGIES: tuple[str, ...] = tuple(s for s in STOPPING_STRATEGIES if s != "infinite")

_END = object()  # what ``next`` returns for an exhausted iterator


def interleave_datasets(
    datasets: list[Iterable],
    probabilities: list[float] | None = None,
    seed: int | None = None,
    stopping_strategy: StoppingStrategy = "first_exhausted",
) -> Iterator:
    """Interleave plain iterables by weighted random choice (a framework-agnostic utility).

    Validation happens at call time; the returned iterator does the sampling.

    Args:
        datasets: iterables to interleave.
        probabilities: one sampling probability per iterable; must be >= 0 and sum to 1.
            ``None`` alternates between the iterables in order (round-robin), as the
            ``datasets`` library does.
        seed: seed of the ``random.Random`` that picks the iterable for each item.
        stopping_strategy: ``"first_exhausted"`` stops as soon as a picked iterable is found
            exhausted; ``"all_exhausted"`` drops exhausted iterables, renormalises the remaining
            probabilities (equal shares if they are all 0) and continues until every iterable is
            exhausted, yielding every item exactly once.

    Returns:
        An iterator over the interleaved items.

    Raises:
        ValueError: lengths differ, probabilities are negative or don't sum to 1, or the
            stopping strategy is unknown.
    """
    datasets = list(datasets)
    if probabilities is None:
        _check_stopping_strategy(stopping_strategy)
        return _round_robin(datasets, stopping_strategy)
    probabilities = [float(p) for p in probabilities]
    if len(datasets) != len(probabilities):
        raise ValueError(
            f"interleave_datasets: the number of datasets ({len(datasets)}) and probabilities "
            f"({len(probabilities)}) must be the same."
        )
    bad = [p for p in probabilities if not math.isfinite(p) or p < 0]
    if bad:
        raise ValueError(f"interleave_datasets: probabilities must be finite and >= 0, got {probabilities}.")
    if datasets and abs(sum(probabilities) - 1.0) >= 1e-6:
        raise ValueError(
            f"interleave_datasets: probabilities must sum to 1.0, got {probabilities} "
            f"(sum {sum(probabilities):.6g}); divide them by their sum."
        )
    _check_stopping_strategy(stopping_strategy)
    return _weighted_choice(datasets, probabilities, seed, stopping_strategy)


def _check_stopping_strategy(stopping_strategy: str) -> None:
    if stopping_strategy not in FINITE_STOPPING_STRATEGIES:
        allowed = " or ".join(repr(s) for s in FINITE_STOPPING_STRATEGIES)
        raise ValueError(f"interleave_datasets: stopping_strategy must be {allowed}, got {stopping_strategy!r}.")


def _weighted_choice(
    datasets: list[Iterable], probabilities: list[float], seed: int | None, stopping_strategy: str
) -> Iterator:
    """Each item from an iterable picked with its probability; exhausted ones leave the draw."""
    rng = random.Random(seed)
    iterators = [iter(ds) for ds in datasets]
    active = list(range(len(iterators)))
    active_probabilities = list(probabilities)
    while active:
        if sum(active_probabilities) > 0:
            k = rng.choices(range(len(active)), weights=active_probabilities, k=1)[0]
        else:  # every remaining probability is 0: equal shares
            k = rng.randrange(len(active))
        item = next(iterators[active[k]], _END)
        if item is not _END:
            yield item
            continue
        if stopping_strategy == "first_exhausted":
            return
        active.pop(k)
        active_probabilities.pop(k)
        total = sum(active_probabilities)
        if active_probabilities and total > 0:
            active_probabilities = [p / total for p in active_probabilities]


def _round_robin(datasets: list[Iterable], stopping_strategy: str) -> Iterator:
    """One item of each iterable in turn; exhausted ones leave the rotation."""
    iterators = [iter(ds) for ds in datasets]
    while iterators:
        for iterator in list(iterators):
            item = next(iterator, _END)
            if item is not _END:
                yield item
                continue
            if stopping_strategy == "first_exhausted":
                return
            iterators.remove(iterator)
