"""LengthPolicy: empty documents skipped, overlong ones cut or dropped, counted, per document and per block."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.arrow import ArrowSource
from lightning_tune_data.sources.arrow_columns import ListColumn
from lightning_tune_data.sources.length_policy import LengthPolicy
from lightning_tune_data.sources.source_state import SourceCounters

from source_tables import gappy_table, table, take


def policy(max_seq_len: int | None = 3, overlong: str = "truncate") -> LengthPolicy:
    return LengthPolicy(StreamSettings(max_seq_len=max_seq_len, overlong=overlong), SourceCounters())


def sample(length: int, mask: bool = False) -> dict:
    document = {"input_ids": np.arange(length), "source": "src", "epoch": 0}
    if mask:
        document["loss_mask"] = np.arange(length) % 2 == 0
    return document


def test_a_document_within_the_limit_is_handed_out_as_it_is():
    document = sample(3)
    assert policy().apply(document) is document
    assert policy(max_seq_len=None).apply(sample(10_000)) is not None


def test_an_empty_document_is_skipped_and_counted():
    lengths = policy()
    assert lengths.apply(sample(0)) is None
    assert lengths.counters.empty_skipped == 1


def test_truncation_cuts_a_copy_with_its_mask_and_says_how_many_tokens_it_lost():
    lengths, document = policy(), sample(7, mask=True)
    cut = lengths.apply(document)
    assert cut["input_ids"].tolist() == [0, 1, 2] and cut["loss_mask"].tolist() == [True, False, True]
    assert cut["truncated_tokens"] == 4
    assert len(document["input_ids"]) == 7 and "truncated_tokens" not in document  # the original is kept
    assert lengths.counters.overlong_truncated == 1


def test_dropping_skips_and_remembers_how_many_were_dropped_since_the_last_document():
    lengths = policy(overlong="drop")
    assert lengths.apply(sample(5)) is None and lengths.apply(sample(4)) is None
    assert lengths.dropped_since_yield == 2 and lengths.counters.overlong_dropped == 2


def test_a_document_read_again_by_reference_counts_nothing():
    for overlong in ("truncate", "drop"):
        lengths = policy(overlong=overlong)
        lengths.apply(sample(0), count=False)
        lengths.apply(sample(9), count=False)
        assert lengths.counters.state_dict() == SourceCounters().state_dict() and lengths.dropped_since_yield == 0


@pytest.mark.parametrize("overlong", ["truncate", "drop"])
@pytest.mark.parametrize("flat", [True, False])
def test_a_block_keeps_cuts_and_counts_exactly_what_the_policy_does_one_document_at_a_time(overlong, flat, monkeypatch):
    if not flat:
        monkeypatch.setattr(ListColumn, "flat", lambda self: None)  # every document read as a view
    data = gappy_table(120)
    column = ListColumn(data.column("input_ids"), "input_ids", "src")
    one_by_one, in_bulk = policy(5, overlong), policy(5, overlong)
    rows = np.random.default_rng(2).permutation(120)
    expected = []
    for row in rows.tolist():
        kept = one_by_one.apply({"input_ids": column.row(row)})
        if kept is not None:
            expected.append((row, kept["input_ids"].tolist(), kept.get("truncated_tokens", 0), one_by_one.dropped_since_yield))
            one_by_one.dropped_since_yield = 0
    store = object()
    block = in_bulk.block("src", 4, rows, column, {"src": {}}, store)
    tokens = block.tokens if not flat else [column.flat().values[p : p + n] for p, n in zip(block.tokens, block.lengths)]
    got = [(row, np.asarray(ids).tolist(), cut, before)
           for row, ids, cut, before in zip(block.rows, tokens, block.truncated_tokens, block.dropped_before)]
    assert got == expected
    assert in_bulk.counters == one_by_one.counters and in_bulk.dropped_since_yield == one_by_one.dropped_since_yield
    assert (block.source, block.epoch, block.store) == ("src", 4, store if flat else None)
    assert block.read_lengths.tolist() == [len(column.row(row)) for row in rows.tolist()]


def test_a_block_of_only_skipped_rows_is_none_and_the_drops_carry_over_to_the_next_document():
    data = table(14)  # rows 5, 6, 12 and 13 hold 6 or 7 tokens
    column = ListColumn(data.column("input_ids"), "input_ids", "src")
    lengths = policy(5, "drop")
    assert lengths.block("src", 0, np.array([5, 6]), column, {}, None) is None
    assert lengths.dropped_since_yield == 2
    block = lengths.block("src", 0, np.array([12, 0, 13, 1]), column, {}, None)
    assert block.rows == [0, 1] and block.dropped_before == [3, 1]
    assert lengths.dropped_since_yield == 0 and lengths.counters.overlong_dropped == 4


def test_overlong_documents_are_truncated_or_dropped_and_counted():
    truncating = ArrowSource(table(14), "src", shuffle=False, max_seq_len=3, overlong="truncate")
    assert max(len(s["input_ids"]) for s in take(truncating, 14)) == 3
    samples = take(truncating, 14)
    assert truncating.counters["overlong_truncated"] == 16  # rows with 4..7 tokens, two passes
    assert sum(s.get("truncated_tokens", 0) for s in samples) == 2 * (1 + 2 + 3 + 4)
    dropping = ArrowSource(table(14), "src", shuffle=False, max_seq_len=3, overlong="drop")
    kept = take(dropping, 6)
    assert all(len(s["input_ids"]) <= 3 for s in kept)
    assert dropping.counters["overlong_dropped"] >= 4
    assert sum(s.get("dropped_before", 0) for s in kept) == 4  # the four rows of 4..7 tokens in pass 0
