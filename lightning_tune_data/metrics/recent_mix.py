"""Per-source counts over the most recent train batches: the realised mix *now*.

:class:`RecentMix` keeps, for each of the last ``window`` batches, the documents started and
tokens seen per source, so the realised mix now can be reported next to the cumulative one: a
changed weight shows within one window instead of being diluted by everything since step 0. It
holds plain ints only; several ranks' windows are united by adding them up.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["BATCHES", "RecentMix", "WINDOW"]

#: State key: the number of batches kept.
WINDOW = "window"
#: State key: the kept batches, oldest first, each ``{source: [documents, tokens]}``.
BATCHES = "batches"


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
        """Record one batch: per source, documents started and tokens seen.

        Args:
            sources: Source of each document piece.
            tokens: Tokens of each piece.
            new_document: Whether each piece starts its document (only those count as documents).
        """
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
            for batch in state[BATCHES]:
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

    @staticmethod
    def folded(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """One state equal to several ranks' states together: counts summed batch by batch.

        The ranks' windows are aligned at their newest batch (they stepped together), and the
        folded window is the largest of theirs.

        Args:
            states: :meth:`state_dict` of each old rank (a missing state is ``{}``).
        """
        window = max((int(s.get(WINDOW, 0)) for s in states), default=0)
        longest = max((len(s.get(BATCHES, [])) for s in states), default=0)
        batches: list[dict[str, list[int]]] = [{} for _ in range(longest)]
        for state in states:
            own = state.get(BATCHES, [])
            for index, batch in enumerate(own, start=longest - len(own)):
                for source, (docs, tokens) in batch.items():
                    total = batches[index].setdefault(source, [0, 0])
                    total[0] += int(docs)
                    total[1] += int(tokens)
        return {WINDOW: window, BATCHES: batches}

    def state_dict(self) -> dict[str, Any]:
        """``{"window": W, "batches": [{source: [docs, tokens]}, ...]}`` (oldest first, plain types)."""
        return {WINDOW: self.window, BATCHES: [{s: list(v) for s, v in b.items()} for b in self._batches]}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore batches saved by :meth:`state_dict` (the newest ``window`` of them).

        Args:
            state_dict: What :meth:`state_dict` returned.
        """
        self._batches = deque(
            ({str(s): [int(v[0]), int(v[1])] for s, v in b.items()} for b in state_dict.get(BATCHES, [])),
            maxlen=self.window,
        )
