"""LengthPolicyCounts: documents cut or dropped by the length policy, alone and from real collated batches."""

from __future__ import annotations

import itertools

import numpy as np

from lightning_tune_data import InMemoryStream, PaddedCollator
from lightning_tune_data.metrics.aggregator import DatasetMetricsAggregator
from lightning_tune_data.metrics.length_policy import LENGTH_POLICY_METRICS, LengthPolicyCounts

PAD = 258


def documents(count: int, length: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=length) for _ in range(count)]


def test_truncation_metrics_equal_the_overlong_documents() -> None:
    # Source "a": 3 of 8 documents were cut by the stream (truncated_tokens set), 2 dropped before others.
    a_docs = [{"input_ids": d} for d in documents(8, 6, 5)]
    for i, cut in ((0, 4), (3, 1), (6, 10)):
        a_docs[i]["truncated_tokens"] = cut
    a_docs[1]["dropped_before"] = 2
    # Source "b": 2 of 6 documents are longer than max_seq_len=8 and reach the collator's safety net.
    b_docs = documents(4, 6, 6) + documents(2, 11, 7)
    collate = PaddedCollator(pad_id=PAD, max_seq_len=8)
    aggregator = DatasetMetricsAggregator({"a": 1, "b": 1})
    for name, docs in (("a", a_docs), ("b", b_docs)):
        samples = list(itertools.islice(iter(InMemoryStream(docs, name, shuffle=False)), len(docs)))
        batch = collate(samples)
        aggregator.update(batch["provenance"], batch)
    metrics = aggregator.compute(distributed=False)
    assert {k: metrics["a"]["metrics"][k] for k in ("truncated_docs", "truncated_tokens", "dropped_docs")} == {
        "truncated_docs": 3, "truncated_tokens": 15, "dropped_docs": 2}
    assert {k: metrics["b"]["metrics"][k] for k in ("truncated_docs", "truncated_tokens", "dropped_docs")} == {
        "truncated_docs": 2, "truncated_tokens": 6, "dropped_docs": 0}
    assert metrics["all"]["metrics"]["truncated_docs"] == 5 and metrics["all"]["metrics"]["dropped_docs"] == 2


def test_length_policy_counts_each_document_once_and_sum_over_ranks() -> None:
    counts = LengthPolicyCounts()
    counts.add(["a", "a", "b"], [3, 3, 0], [0, 0, 1], [True, False, True])  # a's second piece continues the first
    other = LengthPolicyCounts()
    other.add(["a"], [2], [4], [True])
    merged = LengthPolicyCounts.merged([counts.state_dict(), other.state_dict()])
    none = {"no_target_docs": 0, "target_tokens": 0}  # no batch said how many targets its pieces had
    assert merged == {"a": {"truncated_docs": 2, "truncated_tokens": 5, "dropped_docs": 4, **none},
                      "b": {"truncated_docs": 0, "truncated_tokens": 0, "dropped_docs": 1, **none}}




def test_counts_round_trip_their_state_in_the_order_of_the_metric_names() -> None:
    counts = LengthPolicyCounts()
    counts.add(["a", "b", "a"], [5, 0, 0], [1, 2, 0], [True, True, True])
    assert counts.state_dict() == {"a": [1, 5, 1, 0, 0], "b": [0, 0, 2, 0, 0]}
    assert dict(zip(LENGTH_POLICY_METRICS, counts.state_dict()["a"])) == LengthPolicyCounts.merged(
        [counts.state_dict()])["a"]
    restored = LengthPolicyCounts()
    restored.load_state_dict(counts.state_dict())
    restored.add(["b"], [3], [0], [True])
    assert restored.state_dict() == {"a": [1, 5, 1, 0, 0], "b": [1, 3, 2, 0, 0]}
    assert counts.state_dict() == {"a": [1, 5, 1, 0, 0], "b": [0, 0, 2, 0, 0]}, "the restored copy shares no list"


def test_folded_states_sum_per_source() -> None:
    first, second = LengthPolicyCounts(), LengthPolicyCounts()
    first.add(["a", "b"], [2, 0], [0, 1], [True, True])
    second.add(["a", "c"], [7, 1], [3, 0], [True, True])
    folded = LengthPolicyCounts.folded([first.state_dict(), second.state_dict(), {}])
    assert folded == {"a": [2, 9, 3, 0, 0], "b": [0, 0, 1, 0, 0], "c": [1, 1, 0, 0, 0]}
    assert LengthPolicyCounts.merged([folded]) == LengthPolicyCounts.merged([first.state_dict(), second.state_dict()])


def test_documents_without_a_target_are_counted_once_per_document_and_targets_summed_over_pieces() -> None:
    counts = LengthPolicyCounts()
    # sft: an all-prompt document, a document with 3 targets split over two pieces; web: 5 targets
    counts.add(["sft", "sft", "sft", "web"], [9, 0, 0, 0], [0, 0, 0, 0], [True, True, False, True], [0, 1, 2, 5])
    counts.add(["sft"], [4], [0], [True], [0])
    assert LengthPolicyCounts.merged([counts.state_dict()]) == {
        "sft": {"truncated_docs": 2, "truncated_tokens": 13, "dropped_docs": 0, "no_target_docs": 2, "target_tokens": 3},
        "web": {"truncated_docs": 0, "truncated_tokens": 0, "dropped_docs": 0, "no_target_docs": 0, "target_tokens": 5},
    }


def test_a_state_saved_before_the_target_counters_restores_them_as_zero_and_keeps_counting() -> None:
    counts = LengthPolicyCounts()
    counts.load_state_dict({"a": [1, 5, 1]})
    counts.add(["a"], [0], [0], [True], [0])
    assert counts.state_dict() == {"a": [1, 5, 1, 1, 0]}
    assert LengthPolicyCounts.folded([{"a": [1, 5, 1]}, counts.state_dict()]) == {"a": [2, 10, 2, 1, 0]}


def test_a_split_document_has_no_target_only_when_none_of_its_pieces_in_the_batch_has_one() -> None:
    from lightning_tune_data.metrics.length_policy import document_targets

    # unpacked or never split: every first piece is a whole document
    assert document_targets([0, 3, 0], [True, True, True]) == [0, 3, 0]
    # concat: a one-token first piece (BOS at a row's end) continues in the next row with targets
    assert document_targets([5, 0, 7, 0, 4], [True, True, False, True, True]) == [5, 7, None, 0, 4]
    # a first piece with no target at the very end of a batch that splits documents may go on later
    assert document_targets([0, 2, 0], [False, True, True]) == [None, 2, None]
    assert document_targets([0, 0, 0], [True, False, False]) == [None, None, None]
