"""``SampleTransforms``: a source's user transforms and filter, applied to one document at a time.

An indexed source can run user callables on each document sample (``message_transform``,
``model_transform``, ``output_transform``, in that order) and skip the ones ``filter_fn`` rejects.
Samples whose callables raise are skipped and counted within the source's error budget.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from lightning_tune_data.keys import SOURCE_ROW
from lightning_tune_data.sources.error_budget import ErrorBudget
from lightning_tune_data.sources.source_state import SourceCounters

__all__ = ["SampleTransforms"]


class SampleTransforms:
    """The transforms and the filter of one source, with its error budget.

    Args:
        source: the source's name (for the error past the budget).
        transforms: callables applied in order, each taking and returning a sample (``None``
            entries are left out).
        filter_fn: optional predicate ``filter_fn(sample, **filter_kwargs) -> bool``; ``False``
            skips the sample.
        filter_kwargs: keyword arguments for ``filter_fn``.
        max_error_count: how many samples whose callables raise are skipped before one raises.
        counters: the source's counters (``filtered`` and ``errors`` are counted into them).
    """

    def __init__(self, source: str, transforms: Sequence[Callable[[dict], dict] | None],
                 filter_fn: Callable[..., bool] | None, filter_kwargs: dict[str, Any] | None, max_error_count: int,
                 counters: SourceCounters) -> None:
        self.transforms = [transform for transform in transforms if transform is not None]
        self.filter_fn = filter_fn
        self.filter_kwargs = dict(filter_kwargs or {})
        self.counters = counters
        self.budget = ErrorBudget(source, max_error_count, "samples failed their transforms",
                                  "Fix the transform or raise max_error_count on this source.")

    @property
    def plain(self) -> bool:
        """Whether samples pass unchanged: no transform and no filter."""
        return not self.transforms and self.filter_fn is None

    def apply(self, sample: dict[str, Any], row: int, count: bool = True) -> dict[str, Any] | None:
        """The sample after the transforms; ``None`` when it is filtered out or a callable raised.

        Args:
            sample: a document sample.
            row: its row in the source (kept as ``source_row`` unless a transform sets one).
            count: count what is skipped (``False`` when a document is read again by reference).

        Raises:
            RuntimeError: more samples failed than the error budget allows.
        """
        try:
            for transform in self.transforms:
                sample = transform(sample)
            if self.filter_fn is not None and not self.filter_fn(sample, **self.filter_kwargs):
                self.counters.filtered += count
                return None
        except Exception:  # noqa: BLE001 - user transforms may raise anything; we count and re-raise
            if not count:
                return None
            self.counters.errors += 1
            self.budget.charge(self.counters.errors, f"row {row}")
            return None
        sample.setdefault(SOURCE_ROW, row)
        return sample
