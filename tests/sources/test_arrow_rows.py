"""ArrowRows: columns opened lazily and never pickled, the rows of a pass in its keyed order, documents."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pytest

import lightning_tune_data.sources.arrow_rows as arrow_rows
from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.arrow_rows import ArrowRows
from lightning_tune_data.sources.pass_order import PassPlan

from source_tables import table


def pass_rows(rows: ArrowRows, epoch: int) -> list[int]:
    """Every row of pass ``epoch`` in the order one shard visits them."""
    plan = PassPlan.fresh(epoch, rows.num_rows, 1, 0)
    return rows.upcoming(plan, rows.num_rows).tolist()


def test_each_pass_is_a_permutation_keyed_by_seed_name_and_pass():
    rows = ArrowRows(table(50), "src", StreamSettings(seed=3), shuffle=True)
    orders = [pass_rows(rows, epoch) for epoch in range(3)]
    assert all(sorted(order) == list(range(50)) for order in orders)
    assert orders[0] != orders[1] != orders[2]
    assert pass_rows(ArrowRows(table(50), "src", StreamSettings(seed=3), True), 1) == orders[1]
    assert pass_rows(ArrowRows(table(50), "src", StreamSettings(seed=4), True), 1) != orders[1]
    assert pass_rows(ArrowRows(table(50), "other", StreamSettings(seed=3), True), 1) != orders[1]
    assert pass_rows(ArrowRows(table(50), "src", StreamSettings(seed=3), False), 1) == list(range(50))


def test_upcoming_rows_do_not_advance_the_plan_and_are_computed_rows_ahead_at_a_time(monkeypatch):
    reference = pass_rows(ArrowRows(table(100), "src", StreamSettings(seed=8), True), 0)
    monkeypatch.setattr(arrow_rows, "_ROWS_AHEAD", 16)
    rows = ArrowRows(table(100), "src", StreamSettings(seed=8), True)
    plan = PassPlan.fresh(0, 100, 1, 0)
    got = []
    while not plan.done:
        upcoming = rows.upcoming(plan, 7)
        assert rows.upcoming(plan, 7).tolist() == upcoming.tolist() and len(upcoming) <= 7
        got += upcoming.tolist()
        plan.advance(len(upcoming))
    assert got == reference


def test_a_document_is_a_zero_copy_sample_with_its_row_pass_and_bool_loss_mask():
    rows = ArrowRows(table(10, with_mask=True), "docs", StreamSettings(), True)
    rows.open()
    document = rows.document(3, 2)
    assert (document["source"], document["epoch"], document["source_row"]) == ("docs", 2, 3)
    assert document["input_ids"].tolist() == [3] * 4 and not document["input_ids"].flags.owndata
    assert document["loss_mask"].dtype == np.bool_ and document["loss_mask"].tolist() == [True, False, True, False]


def test_columns_open_once_in_the_reading_process_and_are_not_pickled():
    rows = ArrowRows(table(10), "src", StreamSettings(seed=1), True)
    rows.open()
    column = rows.input_ids
    rows.open()
    assert rows.input_ids is column and rows.loss_mask is None
    rows.upcoming(PassPlan.fresh(0, 10, 1, 0), 4)
    copy = pickle.loads(pickle.dumps(rows))
    assert copy.input_ids is None and copy._rows_ahead is None and copy._permutations == {}
    copy.open()
    assert pass_rows(copy, 0) == pass_rows(rows, 0)


def test_a_table_without_rows_or_without_token_ids_is_refused_naming_the_source():
    with pytest.raises(ValueError, match="Source 'void' has no rows"):
        ArrowRows(table(0), "void", StreamSettings(), True)
    rows = ArrowRows(pa.table({"text": ["a", "b"]}), "raw", StreamSettings(), True)
    with pytest.raises(KeyError, match="Source 'raw': the cached dataset has no 'input_ids' column"):
        rows.open()
