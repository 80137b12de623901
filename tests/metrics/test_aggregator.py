"""DatasetMetricsAggregator: per-source/stream metrics, packing stats, state, memory, gloo reduction."""

from __future__ import annotations

import json
import os
import statistics
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lightning_tune_data.metrics import DatasetMetricsAggregator, StandardMetricCollector


def provenance(sources: Sequence[str], tokens: Sequence[int], epochs: Sequence[int] | None = None,
               new_document: Sequence[bool] | None = None, rows: Sequence[int] | None = None) -> dict[str, list]:
    """A ``batch["provenance"]`` side channel.

    Args:
        sources: Source of each piece.
        tokens: Tokens of each piece.
        epochs: Epoch of each piece (default 0).
        new_document: New-document flag of each piece (default True).
        rows: Batch row of each piece (default 0).
    """
    n = len(sources)
    return {
        "source": list(sources),
        "epoch": list(epochs or [0] * n),
        "tokens": list(tokens),
        "row": list(rows or [0] * n),
        "new_document": list(new_document if new_document is not None else [True] * n),
    }


class LongestDocumentCollector:
    """A user collector: longest piece seen, mergeable across ranks with ``max``.

    Args:
        dataset_name: Name the metric is reported under.
    """

    def __init__(self, dataset_name: str) -> None:
        self.dataset_name = dataset_name
        self.longest = 0

    def update_metrics(self, sample: dict) -> None:
        self.longest = max(self.longest, int(sample["tokens"]))

    def get_metrics(self) -> dict:
        return {self.dataset_name: {"metrics": {"longest_piece": self.longest}}}

    def merge_metrics(self, states: Sequence[dict]) -> dict:
        return {self.dataset_name: {"metrics": {"longest_piece": max(s["longest"] for s in states)}}}

    def increment_epoch(self) -> None:
        pass

    def state_dict(self) -> dict:
        return {"longest": self.longest}

    def load_state_dict(self, state_dict: dict) -> None:
        self.longest = int(state_dict["longest"])


def test_counts_per_source_and_for_the_whole_stream_with_realised_share() -> None:
    agg = DatasetMetricsAggregator({"web": 3.0, "code": 1.0, "books": 4.0})
    agg.update(provenance(["web", "code", "web"], [10, 4, 6], epochs=[0, 2, 1]))
    agg.update(provenance(["web"], [5], new_document=[False]))
    m = agg.compute(distributed=False)
    assert list(m) == ["all", "web", "code", "books"]
    assert m["all"]["metrics"]["samples_seen"] == 3 and m["all"]["metrics"]["tokens_seen"] == 25
    assert m["all"]["metrics"]["epochs_completed"] == 2
    web = m["web"]["metrics"]
    assert (web["samples_seen"], web["tokens_seen"], web["epochs_completed"]) == (2, 21, 1)
    assert web["share"] == pytest.approx(2 / 3) and web["token_share"] == pytest.approx(21 / 25)
    assert web["target_weight"] == pytest.approx(3 / 8)
    assert m["code"]["metrics"]["share"] == pytest.approx(1 / 3)
    assert m["books"]["metrics"]["samples_seen"] == 0 and m["books"]["metrics"]["share"] == 0.0
    assert web["seq_len_p50"] == statistics.median([10, 6, 5])


def test_sources_without_target_weight_are_added_when_first_seen() -> None:
    agg = DatasetMetricsAggregator(None, stream_name="mix")
    agg.update(provenance(["a", "b"], [1, 2]))
    m = agg.compute(distributed=False)
    assert list(m) == ["mix", "a", "b"]
    assert "target_weight" not in m["a"]["metrics"]


def test_packed_batch_reports_padding_share_efficiency_and_docs_per_pack() -> None:
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]])
    doc_ids = torch.tensor([[0, 0, 1, 1, 2, -1], [0, 0, 0, -1, -1, -1]])
    agg = DatasetMetricsAggregator(None)
    agg.update(
        provenance(["a", "a", "b", "b"], [2, 2, 1, 3], new_document=[False, True, True, True], rows=[0, 0, 0, 1]),
        {"input_ids": torch.zeros(2, 6, dtype=torch.long), "attention_mask": mask, "document_ids": doc_ids},
    )
    stream = agg.compute(distributed=False)["all"]["metrics"]
    assert stream["padding_share"] == pytest.approx(4 / 12)
    assert stream["packing_efficiency"] == pytest.approx(8 / 12)
    assert stream["docs_per_pack"] == pytest.approx(4 / 2)


def test_padded_batch_reports_padding_share_but_no_packing_metrics() -> None:
    agg = DatasetMetricsAggregator(None)
    agg.update(provenance(["a", "a"], [3, 1], rows=[0, 1]), {"attention_mask": torch.tensor([[1, 1, 1], [1, 0, 0]])})
    stream = agg.compute(distributed=False)["all"]["metrics"]
    assert stream["padding_share"] == pytest.approx(2 / 6)
    assert "packing_efficiency" not in stream and "docs_per_pack" not in stream


def test_tensor_provenance_columns_count_like_lists() -> None:
    from_lists, from_tensors = DatasetMetricsAggregator(None), DatasetMetricsAggregator(None)
    from_lists.update(provenance(["a", "b"], [4, 5], epochs=[1, 0]))
    from_tensors.update({"source": ["a", "b"], "tokens": torch.tensor([4, 5]), "epoch": torch.tensor([1, 0]),
                         "new_document": torch.tensor([True, True])})
    assert from_lists.compute(False) == from_tensors.compute(False)


def test_malformed_provenance_raises_errors_naming_the_field() -> None:
    agg = DatasetMetricsAggregator(None)
    with pytest.raises(KeyError, match="'tokens'"):
        agg.update({"source": ["a"]})
    with pytest.raises(ValueError, match="'epoch' has 2 entries"):
        agg.update({"source": ["a"], "tokens": [1], "epoch": [0, 0]})
    with pytest.raises(ValueError, match="stream_name"):
        agg.update(provenance(["all"], [1]))
    with pytest.raises(ValueError, match="stream_name"):
        DatasetMetricsAggregator({"all": 1.0})


def test_user_collectors_from_the_factory_are_merged_with_standard_metrics() -> None:
    agg = DatasetMetricsAggregator(
        None, collectors_factory=lambda name: [StandardMetricCollector(name, 4), LongestDocumentCollector(name)]
    )
    agg.update(provenance(["a", "b", "a"], [7, 30, 2]))
    m = agg.compute(distributed=False)
    assert m["a"]["metrics"]["longest_piece"] == 7 and m["a"]["metrics"]["samples_seen"] == 2
    assert m["all"]["metrics"]["longest_piece"] == 30


def test_state_loads_with_weights_only_and_counting_continues(tmp_path: Path) -> None:
    agg = DatasetMetricsAggregator({"a": 1.0, "b": 1.0})
    agg.update(provenance(["a", "b", "c"], [3, 4, 5], epochs=[0, 1, 0]),
               {"attention_mask": torch.ones(1, 12), "document_ids": torch.zeros(1, 12)})
    torch.save(agg.state_dict(), tmp_path / "agg.pt")
    restored = DatasetMetricsAggregator({"a": 1.0, "b": 1.0})
    restored.load_state_dict(torch.load(tmp_path / "agg.pt", weights_only=True))
    assert restored.compute(False) == agg.compute(False)
    for target in (agg, restored):
        target.update(provenance(["c"], [9]))
    assert restored.compute(False) == agg.compute(False)
    assert restored.compute(False)["c"]["metrics"]["samples_seen"] == 2


def test_loading_state_of_another_stream_raises() -> None:
    with pytest.raises(ValueError, match="stream_name='other'"):
        DatasetMetricsAggregator(None).load_state_dict(DatasetMetricsAggregator(None, stream_name="other").state_dict())


def test_compute_without_process_group_returns_local_metrics() -> None:
    agg = DatasetMetricsAggregator(None)
    agg.update(provenance(["a"], [3]))
    assert not dist.is_initialized()
    assert agg.compute(distributed=True) == agg.compute(distributed=False)


def test_memory_stays_flat_over_a_million_provenance_records() -> None:
    sources = ["web", "code", "books", "math"]
    batches = [
        provenance([sources[(i + j) % 4] for j in range(1000)], [(i * 7 + j) % 509 + 1 for j in range(1000)],
                   epochs=[i] * 1000, new_document=[j % 5 != 0 for j in range(1000)])
        for i in range(8)
    ]
    agg = DatasetMetricsAggregator({s: 1.0 for s in sources}, collectors_factory=lambda n: StandardMetricCollector(n, 1000))
    start = time.perf_counter()
    for i in range(50):  # warm up: fill every window
        agg.update(batches[i % 8])
    agg.compute(False)
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        for i in range(950):
            agg.update(batches[i % 8])
            if i % 100 == 0:
                agg.compute(False)
        growth = tracemalloc.get_traced_memory()[0] - baseline
    finally:
        tracemalloc.stop()
    elapsed = time.perf_counter() - start
    m = agg.compute(False)
    assert m["all"]["metrics"]["tokens_seen"] > 0
    assert m["all"]["metrics"]["samples_seen"] == 1_000_000 * 4 // 5
    assert m["web"]["metrics"]["seq_len_window_size"] == 1000
    assert growth < 256 * 1024, f"aggregator memory grew by {growth} bytes over 950k records"
    assert elapsed < 60, f"1M records took {elapsed:.1f}s"


def test_target_weights_are_reported_as_written() -> None:
    weights = DatasetMetricsAggregator({"prose": 0.6, "arithmetic": 0.3, "reverse": 0.1}).compute(distributed=False)
    assert [weights[n]["metrics"]["target_weight"] for n in ("prose", "arithmetic", "reverse")] == [0.6, 0.3, 0.1]
    assert repr(weights["reverse"]["metrics"]["target_weight"]) == "0.1"

#: An aggregator state as checkpoints written by earlier releases hold it.
SAVED_STATE = {
    "stream_name": "all",
    "collectors": {
        "all": [{"samples_seen": 4, "tokens_seen": 30, "epochs_completed": 2, "seq_lens": [10, 4, 6, 7, 3]}],
        "web": [{"samples_seen": 3, "tokens_seen": 23, "epochs_completed": 1, "seq_lens": [10, 6, 7]}],
        "code": [{"samples_seen": 1, "tokens_seen": 7, "epochs_completed": 2, "seq_lens": [4, 3]}],
    },
    "packing": {"total_positions": 40, "padding_positions": 10, "packed_rows": 4, "packed_row_docs": 5},
    "recent": {"window": 2, "batches": [{"web": [1, 10]}, {"web": [2, 13], "code": [1, 7]}]},
    "length_policy": {"web": [1, 5, 0], "code": [0, 0, 2]},
}


def test_a_state_saved_by_earlier_releases_restores_the_same_metrics_and_saves_back_with_new_counters_at_zero() -> None:
    agg = DatasetMetricsAggregator({"web": 3, "code": 1}, window=2)
    agg.load_state_dict(SAVED_STATE)
    assert agg.state_dict() == SAVED_STATE | {"length_policy": {"web": [1, 5, 0, 0, 0], "code": [0, 0, 2, 0, 0]}}
    m = agg.compute(distributed=False)
    assert list(m) == ["all", "web", "code"]
    assert m["all"]["metrics"] == {
        "samples_seen": 4, "tokens_seen": 30, "epochs_completed": 2, "seq_len_window_size": 5, "seq_len_mean": 6.0,
        "seq_len_p50": 6.0, "seq_len_p95": pytest.approx(9.4), "truncated_docs": 1, "truncated_tokens": 5,
        "dropped_docs": 2, "no_target_docs": 0, "target_tokens": 0, "padding_share": 0.25, "packing_efficiency": 0.75,
        "docs_per_pack": 1.25,
    }
    assert list(m["all"]["metrics"]) == [
        "samples_seen", "tokens_seen", "epochs_completed", "seq_len_window_size", "seq_len_mean", "seq_len_p50",
        "seq_len_p95", "truncated_docs", "truncated_tokens", "dropped_docs", "no_target_docs", "target_tokens",
        "padding_share", "packing_efficiency", "docs_per_pack",
    ], "metrics keep their order, so logged columns keep theirs"
    assert m["code"]["metrics"] == {
        "samples_seen": 1, "tokens_seen": 7, "epochs_completed": 2, "seq_len_window_size": 2, "seq_len_mean": 3.5,
        "seq_len_p50": 3.5, "seq_len_p95": pytest.approx(3.95), "share": 0.25, "token_share": pytest.approx(7 / 30),
        "target_weight": 0.25, "window_share": 0.25, "window_token_share": pytest.approx(7 / 30),
        "truncated_docs": 0, "truncated_tokens": 0, "dropped_docs": 2, "no_target_docs": 0, "target_tokens": 0,
    }
    assert m["web"]["metrics"]["window_share"] == 0.75 and m["web"]["metrics"]["truncated_tokens"] == 5


def test_state_nests_each_parts_state_under_its_key() -> None:
    from lightning_tune_data.metrics.aggregator import COLLECTORS, LENGTH_POLICY, PACKING, RECENT, STREAM_NAME

    agg = DatasetMetricsAggregator({"a": 1.0}, window=2)
    agg.update(provenance(["a", "b"], [3, 4], new_document=[True, False]) | {"truncated_tokens": [2, 0]},
               {"document_ids": torch.tensor([[0, 0, 1, -1]])})
    state = agg.state_dict()
    assert list(state) == [STREAM_NAME, COLLECTORS, PACKING, RECENT, LENGTH_POLICY]
    assert state[STREAM_NAME] == "all" and list(state[COLLECTORS]) == ["all", "a", "b"]
    assert state[COLLECTORS]["b"] == [{"samples_seen": 0, "tokens_seen": 4, "epochs_completed": 0, "seq_lens": [4]}]
    assert state[PACKING] == {"total_positions": 4, "padding_positions": 1, "packed_rows": 1, "packed_row_docs": 2}
    assert state[RECENT] == {"window": 2, "batches": [{"a": [1, 3], "b": [0, 4]}]}
    assert state[LENGTH_POLICY] == {"a": [1, 2, 0, 0, 0]}


def test_names_list_the_stream_first_then_sources_as_they_appear() -> None:
    agg = DatasetMetricsAggregator({"z": 1.0}, stream_name="mix")
    assert agg.names == ["mix", "z"]
    agg.update(provenance(["b", "a", "z"], [1, 1, 1]))
    assert agg.names == ["mix", "z", "b", "a"]
    agg.load_state_dict(DatasetMetricsAggregator(None, stream_name="mix").state_dict())
    assert agg.names == ["mix", "z"], "restoring keeps the stream and the weighted sources"


def test_invalid_weights_and_stream_names_raise() -> None:
    with pytest.raises(ValueError, match="non-empty string"):
        DatasetMetricsAggregator(None, stream_name="")
    with pytest.raises(ValueError, match="finite, non-negative and sum to > 0"):
        DatasetMetricsAggregator({"a": -1.0, "b": 2.0})
    with pytest.raises(ValueError, match="returned no collector"):
        DatasetMetricsAggregator(None, collectors_factory=lambda name: [])
    agg = DatasetMetricsAggregator({"a": 1.0})
    agg.set_source_weights(None)
    assert agg.source_weights == {}
    assert "target_weight" not in agg.compute(distributed=False)["a"]["metrics"]

# --------------------------------------------------------------------------- real gloo, 2 processes
def _gloo_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """Each rank feeds its own provenance, then computes (a collective) and writes the result.

    Args:
        rank: This process's rank.
        world: Number of processes.
        init_file: File for ``init_method="file://..."``.
        out_dir: Where ``rank<R>.json`` goes.
    """
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        agg = DatasetMetricsAggregator(
            {"a": 1.0, "b": 1.0},
            collectors_factory=lambda n: [StandardMetricCollector(n, 3), LongestDocumentCollector(n)],
        )
        if rank == 0:
            agg.update(provenance(["a", "a", "b", "a", "a"], [1, 2, 3, 4, 5], epochs=[0, 0, 0, 1, 1]),
                       {"attention_mask": torch.ones(1, 15), "document_ids": torch.zeros(1, 15)})
        else:
            agg.update(provenance(["b", "c", "b", "b", "a"], [40, 50, 60, 70, 80], epochs=[3, 0, 0, 0, 0],
                                  new_document=[True, True, False, True, True]),
                       {"attention_mask": torch.tensor([[1] * 300 + [0] * 100]),
                        "document_ids": torch.tensor([[0] * 300 + [-1] * 100])})
        result = agg.compute(distributed=True)
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_gloo_reduction_sums_counters_and_takes_percentiles_of_union_window(tmp_path: Path) -> None:
    mp.start_processes(_gloo_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, start_method="spawn")
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert results[0] == results[1]
    m: dict[str, Any] = results[0]
    assert list(m) == ["all", "a", "b", "c"]  # "c" was only seen by rank 1
    a, b, c, stream = (m[k]["metrics"] for k in ("a", "b", "c", "all"))
    assert (a["samples_seen"], a["tokens_seen"], a["epochs_completed"]) == (5, 92, 1)
    assert (b["samples_seen"], b["tokens_seen"], b["epochs_completed"]) == (3, 173, 3)
    assert c["samples_seen"] == 1 and "target_weight" not in c
    # window 3 per rank: rank0 a=[2,4,5], rank1 a=[80]; rank0 all=[3,4,5], rank1 all=[60,70,80]
    assert a["seq_len_p50"] == statistics.median([2, 4, 5, 80]) == 4.5
    assert stream["seq_len_p50"] == statistics.median([3, 4, 5, 60, 70, 80]) == 32.5
    assert stream["seq_len_window_size"] == 6
    assert stream["samples_seen"] == 9 and stream["tokens_seen"] == 15 + 300
    assert a["share"] == pytest.approx(5 / 9) and a["target_weight"] == pytest.approx(0.5)
    assert stream["longest_piece"] == 80 and b["longest_piece"] == 70
    assert stream["padding_share"] == pytest.approx(100 / 415)
    assert stream["docs_per_pack"] == pytest.approx(10 / 2)
