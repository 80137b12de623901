"""The mixture plan: planned documents, tokens and passes per source, where caps cut, repeat warnings."""

from __future__ import annotations

import pytest

from lightning_tune_data.mixing.mixture_plan import REPEAT_WARNING_EPOCHS, SourceSize, plan_mixture
from lightning_tune_data.mixing.timeline import WeightTimeline


def anneal() -> WeightTimeline:
    return WeightTimeline.from_points(["web", "code", "math"], [(0.0, [0.7, 0.3, 0.0]), (800.0, [0.7, 0.3, 0.0]),
                                                                (1000.0, [0.3, 0.3, 0.4])], "linear", "documents", 64.0)


def test_an_anneal_plans_each_source_and_cuts_a_capped_one_where_its_cap_is_reached() -> None:
    sizes = {"web": SourceSize(100_000, 300.0), "code": SourceSize(5_000, 500.0, max_epochs=2),
             "math": SourceSize(2_000, 200.0)}
    plan = plan_mixture(anneal(), sizes, "documents", "documents", 64.0, 1000)
    rows = {row.name: row for row in plan.sources}
    assert rows["code"].cap_step == pytest.approx(10_000 / (0.3 * 64))  # 2 passes of 5,000 at 19.2 per step
    assert rows["code"].documents == pytest.approx(10_000) and rows["code"].epochs == pytest.approx(2.0)
    assert plan.timeline.weights_at(900)["code"] == 0.0
    assert sum(row.documents for row in plan.sources) == pytest.approx(64_000)
    # math: the anneal's mean weight over the last 200 steps is 0.2 (linear from 0 to 0.4), renormalised after the cut
    assert rows["math"].tokens == pytest.approx(rows["math"].documents * 200.0)
    table = plan.table()
    assert "Mixture plan (over 1,000 steps)" in table and "2 epochs" in table and "521" in table
    assert plan.metrics()["plan/code/cap_step"] == pytest.approx(520.83, abs=0.01)
    assert plan.exhausted_step is None and not plan.warnings


def test_a_source_read_more_than_the_threshold_gets_a_warning() -> None:
    sizes = {"web": SourceSize(100_000, 300.0), "code": SourceSize(500, 500.0), "math": SourceSize(2_000, 200.0)}
    plan = plan_mixture(anneal(), sizes, "documents", "documents", 64.0, 1000)
    assert [w for w in plan.warnings if "'code'" in w and f"more than {REPEAT_WARNING_EPOCHS:g} passes" in w]


def test_shares_of_tokens_and_steps_of_packed_tokens() -> None:
    timeline = WeightTimeline.from_points(["a", "b"], [(0.0, [0.5, 0.5])], "step", "tokens", 4096.0)
    sizes = {"a": SourceSize(1000, 100.0), "b": SourceSize(1000, 400.0)}
    plan = plan_mixture(timeline, sizes, "tokens", "tokens", 4096.0, 10)
    a, b = plan.sources
    assert a.tokens == pytest.approx(b.tokens) == pytest.approx(20480.0)
    assert a.documents == pytest.approx(4 * b.documents)


def test_every_source_capped_ends_the_plan_at_the_step_the_last_cap_is_reached() -> None:
    timeline = WeightTimeline.from_points(["a", "b"], [(0.0, [0.5, 0.5])], "step", "documents", 10.0)
    sizes = {"a": SourceSize(100, 10.0, max_epochs=1), "b": SourceSize(50, 10.0, max_tokens=1000)}
    plan = plan_mixture(timeline, sizes, "documents", "documents", 10.0, 1000)
    rows = {row.name: row for row in plan.sources}
    assert rows["b"].cap_step == pytest.approx(20.0)  # 100 documents of 10 tokens at 5 per step
    assert rows["a"].cap_step == pytest.approx(20.0)  # 100 documents: 5 per step, then 10 per step
    assert plan.exhausted_step == pytest.approx(20.0)
    unknown_end = plan_mixture(timeline, sizes, "documents", "documents", 10.0, None)
    assert unknown_end.exhausted_step == pytest.approx(20.0)
