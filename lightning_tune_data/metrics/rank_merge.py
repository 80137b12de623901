"""Fold several ranks' dataset-metric states into one, for a resume with another world size.

Every logged dataset metric is a global reduction over ranks (counters summed, epochs as the
maximum, length statistics over the union of the windows, windowed shares summed batch by
batch), so one state holding the fold of all old ranks, given to rank 0 of the new run while the
other ranks start empty, logs exactly what the old run would have logged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["merge_rank_states"]

_STANDARD_KEYS = {"samples_seen", "tokens_seen", "epochs_completed", "seq_lens"}


def _merge_collector(states: Sequence[dict[str, Any]], name: str) -> dict[str, Any]:
    if any(set(state) != _STANDARD_KEYS for state in states):
        raise ValueError(
            f"DatasetMetricsCallback: the saved metrics of '{name}' come from a custom collector whose state cannot be "
            "folded across ranks; resume with the checkpoint's world size, or drop the callback state to restart the "
            "counters."
        )
    window = [int(x) for state in states for x in state["seq_lens"]]
    return {
        "samples_seen": sum(int(s["samples_seen"]) for s in states),
        "tokens_seen": sum(int(s["tokens_seen"]) for s in states),
        "epochs_completed": max(int(s["epochs_completed"]) for s in states),
        "seq_lens": window,
    }


def _merge_recent(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Windowed counts summed batch by batch, aligned at the newest batch."""
    window = max((int(s.get("window", 0)) for s in states), default=0)
    longest = max((len(s.get("batches", [])) for s in states), default=0)
    batches: list[dict[str, list[int]]] = [{} for _ in range(longest)]
    for state in states:
        own = state.get("batches", [])
        for index, batch in enumerate(own, start=longest - len(own)):
            for source, (docs, tokens) in batch.items():
                total = batches[index].setdefault(source, [0, 0])
                total[0] += int(docs)
                total[1] += int(tokens)
    return {"window": window, "batches": batches}


def merge_rank_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One aggregator state equivalent to all of ``states`` together (see the module docstring)."""
    names = sorted({name for state in states for name in state["collectors"]})
    collectors = {}
    for name in names:
        per_rank = [state["collectors"][name] for state in states if name in state["collectors"]]
        collectors[name] = [_merge_collector([r[i] for r in per_rank], name) for i in range(len(per_rank[0]))]
    packing: dict[str, int] = {}
    policy: dict[str, list[int]] = {}
    for state in states:
        for key, value in state.get("packing", {}).items():
            packing[key] = packing.get(key, 0) + int(value)
        for source, values in state.get("length_policy", {}).items():
            total = policy.setdefault(source, [0] * len(values))
            policy[source] = [a + int(b) for a, b in zip(total, values)]
    return {
        "stream_name": states[0]["stream_name"],
        "collectors": collectors,
        "packing": packing,
        "recent": _merge_recent([state.get("recent", {}) for state in states]),
        "length_policy": policy,
    }
