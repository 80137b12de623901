"""Fold several ranks' dataset-metric states into one, for a resume with another world size.

Every logged dataset metric is a global reduction over ranks (counters summed, epochs as the
maximum, length statistics over the union of the windows, windowed shares summed batch by
batch), so one state holding the fold of all old ranks, given to rank 0 of the new run while the
other ranks start empty, logs exactly what the old run would have logged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lightning_tune_data.metrics.aggregator import COLLECTORS, LENGTH_POLICY, PACKING, RECENT, STREAM_NAME
from lightning_tune_data.metrics.collector import (
    EPOCHS_COMPLETED,
    SAMPLES_SEEN,
    SEQ_LENS,
    STANDARD_STATE_KEYS,
    TOKENS_SEEN,
)
from lightning_tune_data.metrics.length_policy import LengthPolicyCounts
from lightning_tune_data.metrics.packing_counts import PackingCounts
from lightning_tune_data.metrics.recent_mix import RecentMix

__all__ = ["merge_rank_states"]


def _merge_collector(states: Sequence[dict[str, Any]], name: str) -> dict[str, Any]:
    """One :class:`StandardMetricCollector` state equal to several ranks' states of ``name`` together.

    Args:
        states: The collector's state on each rank that has one.
        name: The stream or source the collector counts (named in the error).

    Raises:
        ValueError: a state comes from another collector class, which cannot be folded.
    """
    if any(set(state) != STANDARD_STATE_KEYS for state in states):
        raise ValueError(
            f"DatasetMetricsCallback: the saved metrics of '{name}' come from a custom collector whose state cannot be "
            "folded across ranks; resume with the checkpoint's world size, or drop the callback state to restart the "
            "counters."
        )
    window = [int(x) for state in states for x in state[SEQ_LENS]]
    return {
        SAMPLES_SEEN: sum(int(s[SAMPLES_SEEN]) for s in states),
        TOKENS_SEEN: sum(int(s[TOKENS_SEEN]) for s in states),
        EPOCHS_COMPLETED: max(int(s[EPOCHS_COMPLETED]) for s in states),
        SEQ_LENS: window,
    }


def merge_rank_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One aggregator state equivalent to all of ``states`` together (see the module docstring).

    Args:
        states: :meth:`DatasetMetricsAggregator.state_dict` of every old rank.

    Raises:
        ValueError: a collector state cannot be folded (a custom collector).
    """
    names = sorted({name for state in states for name in state[COLLECTORS]})
    collectors = {}
    for name in names:
        per_rank = [state[COLLECTORS][name] for state in states if name in state[COLLECTORS]]
        collectors[name] = [_merge_collector([r[i] for r in per_rank], name) for i in range(len(per_rank[0]))]
    return {
        STREAM_NAME: states[0][STREAM_NAME],
        COLLECTORS: collectors,
        PACKING: PackingCounts.folded(state.get(PACKING, {}) for state in states),
        RECENT: RecentMix.folded([state.get(RECENT, {}) for state in states]),
        LENGTH_POLICY: LengthPolicyCounts.folded(state.get(LENGTH_POLICY, {}) for state in states),
    }
