"""ErrorBudget: failures within max_error_count pass; the next one raises with the first one's report."""

from __future__ import annotations

import pytest

from lightning_tune_data.sources.error_budget import ErrorBudget


def fail(budget: ErrorBudget, errors: int, where: str, message: str) -> None:
    try:
        raise ValueError(message)
    except ValueError:
        budget.charge(errors, where)


def test_failures_within_the_budget_pass_and_the_first_one_is_remembered_with_its_traceback():
    budget = ErrorBudget("web", 2, "rows failed", "Fix it.")
    fail(budget, 1, "row 3", "first problem")
    fail(budget, 2, "row 8", "second problem")
    assert budget.first_failure.startswith("row 3:\nTraceback") and "first problem" in budget.first_failure
    assert "second problem" not in budget.first_failure


def test_one_failure_past_the_budget_raises_naming_source_count_first_failure_and_remedy():
    budget = ErrorBudget("web", 0, "rows could not be read into documents", "Fix the preprocess function.")
    with pytest.raises(RuntimeError) as info:
        fail(budget, 1, "pass 0, stream row 5", "bad mask")
    message = str(info.value)
    assert message.startswith("Source 'web': 1 rows could not be read into documents, more than max_error_count=0.")
    assert "First failure at pass 0, stream row 5:\nTraceback" in message and "ValueError: bad mask" in message
    assert message.endswith("Fix the preprocess function.")
    assert info.value.__suppress_context__  # the report holds the traceback; no second one is chained
