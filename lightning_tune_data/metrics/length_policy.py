"""Documents the length policy truncated or dropped for being longer than ``max_seq_len``, per source.

:class:`LengthPolicyCounts` holds plain ints only, so the counts of several ranks merge by summing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

__all__ = ["LENGTH_POLICY_METRICS", "LengthPolicyCounts"]

#: Counter names reported per source (and for the whole stream), in the order a state lists them.
LENGTH_POLICY_METRICS = ("truncated_docs", "truncated_tokens", "dropped_docs")


class LengthPolicyCounts:
    """Per-source ``truncated_docs``, ``truncated_tokens`` and ``dropped_docs``.

    Counted on document starts only (``new_document``), so a document split over several packs
    is counted once.
    """

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}

    def add(self, sources: Sequence[str], truncated: Sequence[int], dropped: Sequence[int],
            new_document: Sequence[bool]) -> None:
        """Count one batch's document pieces.

        Args:
            sources: Source of each piece.
            truncated: Tokens the policy cut from each piece's document.
            dropped: Documents the policy dropped just before each piece's document.
            new_document: Whether each piece starts its document (only those are counted).
        """
        for source, cut, gone, new in zip(sources, truncated, dropped, new_document):
            if not new:
                continue
            entry = self.counts.setdefault(source, [0, 0, 0])
            entry[0] += int(cut > 0)
            entry[1] += int(cut)
            entry[2] += int(gone)

    @staticmethod
    def merged(states: Iterable[Mapping[str, Sequence[int]]]) -> dict[str, dict[str, int]]:
        """``{source: {metric: summed count}}`` over several ranks' :meth:`state_dict`.

        Args:
            states: One state per rank.
        """
        out: dict[str, list[int]] = {}
        for state in states:
            for source, values in state.items():
                entry = out.setdefault(source, [0, 0, 0])
                for i, value in enumerate(values):
                    entry[i] += int(value)
        return {source: dict(zip(LENGTH_POLICY_METRICS, values)) for source, values in out.items()}

    @staticmethod
    def folded(states: Iterable[Mapping[str, Sequence[int]]]) -> dict[str, list[int]]:
        """One state equal to several ranks' states together (counts summed per source).

        Args:
            states: :meth:`state_dict` of each old rank (a missing state is ``{}``).
        """
        folded: dict[str, list[int]] = {}
        for state in states:
            for source, values in state.items():
                total = folded.setdefault(source, [0] * len(values))
                folded[source] = [a + int(b) for a, b in zip(total, values)]
        return folded

    def state_dict(self) -> dict[str, list[int]]:
        """``{source: [truncated_docs, truncated_tokens, dropped_docs]}`` (plain ints)."""
        return {source: list(values) for source, values in self.counts.items()}

    def load_state_dict(self, state_dict: Mapping[str, Sequence[int]]) -> None:
        """Restore counts saved by :meth:`state_dict` (replacing the current ones).

        Args:
            state_dict: What :meth:`state_dict` returned.
        """
        self.counts = {str(s): [int(v) for v in values] for s, values in state_dict.items()}
