"""The mixture's weights as a function of where the stream is: :class:`WeightTimeline`.

A timeline cuts the run into *quanta* (``[boundaries[q], boundaries[q + 1])``, in the schedule's
unit) with one set of weights each. A ``linear`` or ``cosine`` stretch between two points is cut
into at most :data:`SEGMENT_QUANTA` quanta (one per step when shorter), each with the
interpolated weights at its middle; a ``step`` stretch is one quantum. A source whose cap is
reached (a *cut*) has weight 0 from its cut on, the others renormalised.

The *position* of a draw is computed by each shard from what it drew itself, so no worker waits
for another: ``position = origin + (drawn x shards - origin_count) / counts_per_position``, where
``drawn`` is this shard's count of :attr:`WeightTimeline.count` (documents or tokens) before the
draw. A timeline is the pluggable weight source of a mixture: anything with the same attributes
and :meth:`quantum_of` / :meth:`weights` can replace it, as long as every worker of every rank
computes the same weights from the same position.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections.abc import Mapping, Sequence

from lightning_tune_data.keys import MixBy
from lightning_tune_data.mixing.mix_schedule import interpolated

__all__ = ["WeightTimeline", "SEGMENT_QUANTA"]

#: Most quanta a linear or cosine stretch between two points is cut into (its weights change by at
#: most 1/256 of the stretch's change from one quantum to the next).
SEGMENT_QUANTA = 256


class WeightTimeline:
    """Weights per quantum of the run (see the module docstring).

    Args:
        names: the sources, in the mixture's order.
        boundaries: where each quantum starts (ascending, the first 0).
        weights: per quantum, the normalised weights in ``names`` order (all 0: every source has
            reached its cap there).
        count: what a shard counts to find its position: ``"documents"`` or ``"tokens"``.
        counts_per_position: documents or tokens of the whole run in one unit of position (one
            optimizer step's worth, or 1 when the unit is tokens).
        description: the schedule as configured (what a resume compares).
    """

    def __init__(self, names: Sequence[str], boundaries: Sequence[float], weights: Sequence[Sequence[float]],
                 count: MixBy, counts_per_position: float, description: str = "") -> None:
        if len(boundaries) != len(weights) or not boundaries or boundaries[0] != 0:
            raise ValueError("WeightTimeline: give one weight list per boundary, the first boundary at 0.")
        if counts_per_position <= 0:
            raise ValueError(f"WeightTimeline: counts_per_position must be > 0, got {counts_per_position}.")
        self.names = list(names)
        self.boundaries = [float(b) for b in boundaries]
        self.table = [[float(w) for w in ws] for ws in weights]
        self.count = count
        self.counts_per_position = float(counts_per_position)
        self.description = description
        digest = json.dumps([self.names, self.boundaries, self.table, count, self.counts_per_position, description])
        #: Changes whenever any weight of any quantum does (a resume with the same one is exact).
        self.fingerprint = hashlib.sha256(digest.encode("utf-8")).hexdigest()[:16]

    def __len__(self) -> int:
        return len(self.boundaries)

    def quantum_of(self, position: float) -> int:
        """The quantum that holds ``position``."""
        return max(0, bisect.bisect_right(self.boundaries, position) - 1)

    def weights(self, quantum: int) -> list[float]:
        """The weights of ``quantum``, in ``names`` order."""
        return self.table[quantum]

    def weights_at(self, position: float) -> dict[str, float]:
        """The weights at ``position``, by source name."""
        return dict(zip(self.names, self.weights(self.quantum_of(position))))

    def end_of(self, quantum: int) -> float:
        """Where ``quantum`` ends (``inf`` for the last)."""
        return self.boundaries[quantum + 1] if quantum + 1 < len(self.boundaries) else float("inf")

    @classmethod
    def from_points(cls, names: Sequence[str], points: Sequence[tuple[float, Sequence[float]]], interpolation: str,
                    count: MixBy, counts_per_position: float, cuts: Mapping[str, float] | None = None,
                    description: str = "") -> WeightTimeline:
        """The timeline of resolved points (``(position, weights)``, ascending), with sources cut.

        Args:
            names: the sources, in order.
            points: the schedule's points, positions in its unit.
            interpolation: ``"step"``, ``"linear"`` or ``"cosine"``.
            count, counts_per_position, description: as in the class.
            cuts: per source, the position from which its weight is 0 (its cap is reached).
        """
        starts: list[tuple[float, list[float]]] = [(0.0, list(points[0][1]))]
        for (a, wa), (b, wb) in zip(points, points[1:]):
            span = b - a
            if interpolation != "step" and span > 0 and list(wa) != list(wb):
                n = max(1, min(SEGMENT_QUANTA, int(span)))
                starts.extend((a + span * j / n, interpolated(list(wa), list(wb), (j + 0.5) / n, interpolation))
                              for j in range(n))
            else:
                starts.append((a, list(wa)))
        starts.append((points[-1][0], list(points[-1][1])))
        merged: list[tuple[float, list[float]]] = []
        for start, weights in starts:  # the later of two quanta starting at one position wins
            if merged and merged[-1][0] == start:
                merged[-1] = (start, weights)
            elif not merged or merged[-1][1] != weights:
                merged.append((start, weights))
        for name, cut in sorted((cuts or {}).items(), key=lambda item: item[1]):
            merged = _cut(merged, names.index(name), cut)
        return cls(names, [s for s, _ in merged], [w for _, w in merged], count, counts_per_position, description)

    def with_cuts(self, cuts: Mapping[str, float]) -> WeightTimeline:
        """This timeline with the sources of ``cuts`` at weight 0 from their cut positions on."""
        quanta = list(zip(self.boundaries, self.table))
        for name, cut in sorted(cuts.items(), key=lambda item: item[1]):
            quanta = _cut(quanta, self.names.index(name), cut)
        return WeightTimeline(self.names, [s for s, _ in quanta], [w for _, w in quanta], self.count,
                              self.counts_per_position, self.description)


def _cut(quanta: list[tuple[float, list[float]]], index: int, position: float) -> list[tuple[float, list[float]]]:
    """``quanta`` with source ``index`` at weight 0 from ``position`` on (others renormalised)."""
    out: list[tuple[float, list[float]]] = []
    for q, (start, weights) in enumerate(quanta):
        end = quanta[q + 1][0] if q + 1 < len(quanta) else float("inf")
        if end <= position:
            out.append((start, weights))
            continue
        if start < position:
            out.append((start, weights))
            start = position
        cut = list(weights)
        cut[index] = 0.0
        total = sum(cut)
        out.append((start, [w / total for w in cut] if total > 0 else [0.0] * len(cut)))
    return out
