"""merge_rank_states: several ranks' saved metrics folded into one state for a resume with another world size."""

from __future__ import annotations

import pytest
import torch

from lightning_tune_data.metrics import DatasetMetricsAggregator, DatasetMetricsCallback, StandardMetricCollector
from lightning_tune_data.metrics.rank_merge import merge_rank_states


def test_metrics_saved_by_two_ranks_resume_on_one_rank_with_the_same_global_values() -> None:
    weights = {"web": 0.75, "code": 0.25}
    ranks = [DatasetMetricsAggregator(weights), DatasetMetricsAggregator(weights)]
    ranks[0].update({"source": ["web", "code", "web"], "tokens": [10, 4, 6], "epoch": [0, 2, 1], "new_document": [True] * 3})
    ranks[1].update({"source": ["web", "web"], "tokens": [3, 9], "epoch": [0, 0], "new_document": [True, True]})
    merged = DatasetMetricsAggregator(weights)
    merged.load_state_dict(merge_rank_states([r.state_dict() for r in ranks]))
    got = merged.compute(distributed=False)
    assert got["web"]["metrics"]["samples_seen"] == 4 and got["web"]["metrics"]["tokens_seen"] == 28
    assert got["code"]["metrics"]["samples_seen"] == 1 and got["web"]["metrics"]["epochs_completed"] == 1
    assert sorted(merged.state_dict()["collectors"]["web"][0]["seq_lens"]) == [3, 6, 9, 10]

    callback = DatasetMetricsCallback()
    callback.load_state_dict({"world_size": 2, "ranks": [r.state_dict() for r in ranks]})
    assert callback.aggregator.compute(distributed=False)["web"]["metrics"]["tokens_seen"] == 28


def test_folded_state_logs_what_every_rank_together_would_log() -> None:
    weights = {"web": 0.5, "code": 0.5}
    ranks = [DatasetMetricsAggregator(weights, window=2), DatasetMetricsAggregator(weights, window=2)]
    ranks[0].update({"source": ["web", "code"], "tokens": [5, 3], "truncated_tokens": [2, 0], "dropped_before": [0, 1]},
                    {"attention_mask": torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]])})
    ranks[0].update({"source": ["code"], "tokens": [4]}, {"document_ids": torch.tensor([[0, 0, 0, 0, -1, -1]])})
    ranks[1].update({"source": ["web", "web"], "tokens": [6, 1], "new_document": [True, False]},
                    {"document_ids": torch.tensor([[0, 0, 0, 0, 0, 0], [0, -1, -1, -1, -1, -1]])})
    merged = DatasetMetricsAggregator(weights, window=2)
    merged.load_state_dict(merge_rank_states([r.state_dict() for r in ranks]))
    got = merged.compute(distributed=False)
    stream = got["all"]["metrics"]
    assert (stream["samples_seen"], stream["tokens_seen"]) == (4, 19)
    assert stream["padding_share"] == pytest.approx((4 + 2 + 5) / 30)
    assert stream["docs_per_pack"] == pytest.approx(3 / 3)
    assert (stream["truncated_docs"], stream["truncated_tokens"], stream["dropped_docs"]) == (1, 2, 1)
    # the windows are aligned at the newest batch: rank 1's only batch falls beside rank 0's second one
    assert got["web"]["metrics"]["window_share"] == pytest.approx(2 / 4)
    assert got["code"]["metrics"]["window_token_share"] == pytest.approx(7 / 19)
    assert merged.state_dict()["recent"] == {"window": 2, "batches": [{"web": [1, 5], "code": [1, 3]},
                                                                       {"code": [1, 4], "web": [1, 7]}]}


def test_a_custom_collectors_state_cannot_be_folded() -> None:
    class Counting(StandardMetricCollector):
        def state_dict(self) -> dict:
            return {**super().state_dict(), "extra": 1}

    ranks = [DatasetMetricsAggregator(None, collectors_factory=Counting) for _ in range(2)]
    ranks[0].update({"source": ["a"], "tokens": [1]})
    with pytest.raises(ValueError, match="saved metrics of 'a' come from a custom collector"):
        merge_rank_states([r.state_dict() for r in ranks])


def test_states_without_optional_parts_fold_to_empty_parts() -> None:
    state = {"stream_name": "all", "collectors": {"all": [{"samples_seen": 1, "tokens_seen": 2, "epochs_completed": 0,
                                                           "seq_lens": [2]}]}}
    assert merge_rank_states([state, state]) == {
        "stream_name": "all",
        "collectors": {"all": [{"samples_seen": 2, "tokens_seen": 4, "epochs_completed": 0, "seq_lens": [2, 2]}]},
        "packing": {},
        "recent": {"window": 0, "batches": []},
        "length_policy": {},
    }
