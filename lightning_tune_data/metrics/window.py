"""Per-source counts over the most recent train batches, and the length policy's counters.

:class:`RecentMix` keeps, for each of the last ``window`` batches, the documents started and
tokens seen per source, so the realised mix *now* can be reported next to the cumulative one: a
changed weight shows within one window instead of being diluted by everything since step 0.
:class:`LengthPolicyCounts` counts documents truncated or dropped for being longer than
``max_seq_len``. Both hold plain ints only and merge across ranks by summing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["LENGTH_POLICY_METRICS", "LengthPolicyCounts", "RecentMix"]

#: Counter names reported per source (and for the whole stream).
LENGTH_POLICY_METRICS = ("truncated_docs", "truncated_tokens", "dropped_docs")


class RecentMix:
    """Documents and tokens per source over the last ``window`` batches.

    Args:
        window: number of most recent batches kept (``>= 1``).
    """

    def __init__(self, window: int = 100) -> None:
        if isinstance(window, bool) or int(window) < 1:
            raise ValueError(f"RecentMix: window must be an int >= 1 (batches), got {window!r}.")
        self.window = int(window)
        self._batches: deque[dict[str, list[int]]] = deque(maxlen=self.window)

    def add_batch(self, sources: Sequence[str], tokens: Sequence[int], new_document: Sequence[bool]) -> None:
        """Record one batch: per source, documents started and tokens seen."""
        counts: dict[str, list[int]] = {}
        for source, n, new in zip(sources, tokens, new_document):
            entry = counts.setdefault(source, [0, 0])
            entry[0] += int(bool(new))
            entry[1] += int(n)
        self._batches.append(counts)

    @staticmethod
    def shares(states: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
        """``{source: {"window_share", "window_token_share"}}`` over the union of several states.

        Args:
            states: :meth:`state_dict` of each rank (each rank's own last ``window`` batches).
        """
        docs: dict[str, int] = {}
        tokens: dict[str, int] = {}
        for state in states:
            for batch in state["batches"]:
                for source, (d, t) in batch.items():
                    docs[source] = docs.get(source, 0) + int(d)
                    tokens[source] = tokens.get(source, 0) + int(t)
        total_docs, total_tokens = sum(docs.values()), sum(tokens.values())
        return {
            source: {
                "window_share": docs[source] / total_docs if total_docs else 0.0,
                "window_token_share": tokens[source] / total_tokens if total_tokens else 0.0,
            }
            for source in docs
        }

    def state_dict(self) -> dict[str, Any]:
        """``{"window": W, "batches": [{source: [docs, tokens]}, ...]}`` (oldest first, plain types)."""
        return {"window": self.window, "batches": [{s: list(v) for s, v in b.items()} for b in self._batches]}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore batches saved by :meth:`state_dict` (the newest ``window`` of them)."""
        self._batches = deque(
            ({str(s): [int(v[0]), int(v[1])] for s, v in b.items()} for b in state_dict.get("batches", [])),
            maxlen=self.window,
        )


class LengthPolicyCounts:
    """Per-source ``truncated_docs``, ``truncated_tokens`` and ``dropped_docs``.

    Counted on document starts only (``new_document``), so a document split over several packs
    is counted once.
    """

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}

    def add(self, sources: Sequence[str], truncated: Sequence[int], dropped: Sequence[int],
            new_document: Sequence[bool]) -> None:
        """Count one batch's document pieces."""
        for source, cut, gone, new in zip(sources, truncated, dropped, new_document):
            if not new:
                continue
            entry = self.counts.setdefault(source, [0, 0, 0])
            entry[0] += int(cut > 0)
            entry[1] += int(cut)
            entry[2] += int(gone)

    @staticmethod
    def merged(states: Iterable[Mapping[str, Sequence[int]]]) -> dict[str, dict[str, int]]:
        """``{source: {metric: summed count}}`` over several ranks' :meth:`state_dict`."""
        out: dict[str, list[int]] = {}
        for state in states:
            for source, values in state.items():
                entry = out.setdefault(source, [0, 0, 0])
                for i, value in enumerate(values):
                    entry[i] += int(value)
        return {source: dict(zip(LENGTH_POLICY_METRICS, values)) for source, values in out.items()}

    def state_dict(self) -> dict[str, list[int]]:
        return {source: list(values) for source, values in self.counts.items()}

    def load_state_dict(self, state_dict: Mapping[str, Sequence[int]]) -> None:
        self.counts = {str(s): [int(v) for v in values] for s, values in state_dict.items()}
