"""SampleTransforms: user transforms in order, the filter, and failures counted within the error budget."""

from __future__ import annotations

import pytest

from lightning_tune_data.sources.arrow import ArrowSource
from lightning_tune_data.sources.sample_transforms import SampleTransforms
from lightning_tune_data.sources.source_state import SourceCounters

from source_tables import rows_of, table, take


def transforms(*callables, filter_fn=None, filter_kwargs=None, max_error_count: int = 0) -> SampleTransforms:
    return SampleTransforms("src", callables, filter_fn, filter_kwargs, max_error_count, SourceCounters())


def test_transforms_apply_in_order_and_the_row_is_kept_unless_one_sets_it():
    steps = transforms(lambda s: {**s, "trail": [*s["trail"], "message"]}, None,
                       lambda s: {**s, "trail": [*s["trail"], "output"]})
    assert not steps.plain and transforms().plain and not transforms(filter_fn=bool).plain
    out = steps.apply({"input_ids": [1], "trail": []}, row=12)
    assert out["trail"] == ["message", "output"] and out["source_row"] == 12
    assert transforms(lambda s: {**s, "source_row": 3}).apply({"input_ids": [1]}, row=12)["source_row"] == 3


def test_a_sample_the_filter_rejects_is_skipped_and_counted():
    steps = transforms(filter_fn=lambda s, at_least: len(s["input_ids"]) >= at_least, filter_kwargs={"at_least": 2})
    assert steps.apply({"input_ids": [1]}, row=0) is None
    assert steps.apply({"input_ids": [1, 2]}, row=1) is not None
    assert steps.counters.filtered == 1


def test_failures_are_counted_within_the_budget_and_a_re_read_neither_counts_nor_raises():
    def explode(sample):
        raise ValueError("broken")

    steps = transforms(explode, max_error_count=1)
    assert steps.apply({"input_ids": [1]}, row=4) is None
    assert steps.counters.errors == 1
    assert steps.apply({"input_ids": [1]}, row=4, count=False) is None
    assert steps.counters.errors == 1
    with pytest.raises(RuntimeError, match=r"(?s)2 samples failed their transforms.*row 4:.*broken.*Fix the transform"):
        steps.apply({"input_ids": [1]}, row=5)


def test_failing_transform_rows_are_skipped_until_the_budget_then_raise_with_the_row():
    def explode_on_five(sample):
        if int(sample["input_ids"][0]) == 5:
            raise ValueError("bad row")
        return sample

    tolerant = ArrowSource(table(10), "src", shuffle=False, model_transform=explode_on_five, max_error_count=1)
    assert 5 not in rows_of(take(tolerant, 9))
    assert tolerant.counters["errors"] == 1

    strict = ArrowSource(table(10), "src", shuffle=False, model_transform=explode_on_five, max_error_count=0)
    with pytest.raises(RuntimeError, match=r"(?s)max_error_count=0.*row 5.*bad row"):
        take(strict, 10)


def test_filter_kwargs_are_passed_to_filter_fn():
    stream = ArrowSource(table(10), "src", shuffle=False, filter_fn=lambda s, limit: s["input_ids"][0] < limit,
                         filter_kwargs={"limit": 4})
    assert rows_of(take(stream, 8)) == [0, 1, 2, 3] * 2
