"""Weights that a controller publishes during the run, as a mixture's weight source: :class:`OnlineTimeline`.

Update ``k`` of a controller runs at optimizer step ``k x every`` and its weights apply from the
fixed position ``k x every + delay`` on (positions in optimizer steps, as a shard computes them
from its own draws; see :mod:`~lightning_tune_data.mixing.timeline`). Where each version starts is
known from the start; only its weights arrive later, through
:class:`~lightning_tune_data.mixing.weight_versions.WeightVersions`. So every worker of every rank
draws with the same weights from the same position, whichever process gets there first, and a
worker that gets there before the weights are published waits for them.

With a base timeline (a mixture schedule, or sources' caps) the quanta are those of both, and the
weights of a quantum are the base's times the controller's, renormalised (where that product is
0 for every source, the base's weights hold). The timeline has the attributes and methods of a
:class:`~lightning_tune_data.mixing.timeline.WeightTimeline` that a mixture draws by.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
from collections.abc import Sequence

from lightning_tune_data.keys import MixBy
from lightning_tune_data.mixing.timeline import WeightTimeline
from lightning_tune_data.mixing.weight_versions import WeightVersions

__all__ = ["OnlineTimeline", "ONLINE_BLOCK_DOCUMENTS"]

#: Most documents a mixture drawing by an online timeline hands a packer at once: the packer reads
#: that far ahead of its packs, and the weights' delay must cover it, so it is kept short.
ONLINE_BLOCK_DOCUMENTS = 256


class _Starts:
    """The quanta's start positions, computed as far as they are asked for."""

    def __init__(self, timeline: OnlineTimeline) -> None:
        self.timeline = timeline

    def __getitem__(self, quantum: int) -> float:
        return self.timeline.start_of(quantum)


class OnlineTimeline:
    """A controller's weight versions over the run, on a base timeline (see the module docstring).

    Args:
        names: the sources, in the mixture's order.
        versions: the published weights (version 0: the starting weights).
        every: optimizer steps between two updates.
        delay: steps after its update from which a version applies.
        count, counts_per_position: the clock (as for ``WeightTimeline``; ignored with a ``base``,
            whose clock is used).
        base: the schedule's or caps' timeline the versions multiply (``None``: none).
        scale: positions of the base's unit per optimizer step (1 without a base).
        description: what a resume compares.
    """

    def __init__(self, names: Sequence[str], versions: WeightVersions, every: int, delay: int, count: MixBy,
                 counts_per_position: float, base: WeightTimeline | None = None, scale: float = 1.0,
                 description: str = "") -> None:
        if every < 1 or delay < 1:
            raise ValueError(f"OnlineTimeline: every and delay must be >= 1, got {every} and {delay}.")
        self.names = list(names)
        self.versions = versions
        self.every, self.delay, self.scale = int(every), int(delay), float(scale)
        self.base = base
        self.count: MixBy = base.count if base is not None else count
        self.counts_per_position = base.counts_per_position if base is not None else float(counts_per_position)
        self.description = description
        digest = json.dumps([self.names, self.every, self.delay, self.scale, self.count, self.counts_per_position,
                             None if base is None else base.fingerprint, description])
        #: The same for every run with these settings (the weights themselves are the checkpoint's history).
        self.fingerprint = hashlib.sha256(digest.encode("utf-8")).hexdigest()[:16]
        self.boundaries = _Starts(self)
        self._starts: list[float] = [0.0]
        self._keys: list[tuple[int, int]] = [(0, 0)]  # per quantum: (base quantum, version)
        self._weights: dict[int, list[float]] = {}
        #: Most documents the mixture hands a packer per block (see :data:`ONLINE_BLOCK_DOCUMENTS`).
        self.block_documents = ONLINE_BLOCK_DOCUMENTS

    def __len__(self) -> int:
        return len(self._starts)

    def version_start(self, version: int) -> float:
        """Where ``version`` starts to apply, in the clock's unit."""
        return 0.0 if version == 0 else (version * self.every + self.delay) * self.scale

    def _grow(self) -> None:
        """Append the next quantum: at the next version's start or the base's next boundary."""
        base_q, version = self._keys[-1]
        next_version = self.version_start(version + 1)
        next_base = self.base.end_of(base_q) if self.base is not None else math.inf
        start = min(next_version, next_base)
        self._starts.append(start)
        self._keys.append((base_q + 1 if next_base == start else base_q, version + 1 if next_version == start else version))

    def start_of(self, quantum: int) -> float:
        """Where ``quantum`` starts."""
        while len(self._starts) <= quantum:
            self._grow()
        return self._starts[quantum]

    def quantum_of(self, position: float) -> int:
        """The quantum that holds ``position``."""
        while self._starts[-1] <= position:
            self._grow()
        return max(0, bisect.bisect_right(self._starts, position) - 1)

    def end_of(self, quantum: int) -> float:
        """Where ``quantum`` ends."""
        return self.start_of(quantum + 1)

    def version_of(self, quantum: int) -> int:
        """The controller's version in effect in ``quantum``."""
        self.start_of(quantum)
        return self._keys[quantum][1]

    def weights(self, quantum: int) -> list[float]:
        """The weights of ``quantum`` (waits, in a worker, for a version not published yet)."""
        cached = self._weights.get(quantum)
        if cached is not None:
            return cached
        self.start_of(quantum)
        base_q, version = self._keys[quantum]
        control = self.versions.get(version)
        if self.base is None:
            combined = control
        else:
            base = self.base.weights(base_q)
            product = [b * c for b, c in zip(base, control)]
            total = sum(product)
            combined = [p / total for p in product] if total > 0 else list(base)
        total = sum(combined)
        combined = [w / total for w in combined] if total > 0 else list(combined)
        self._weights[quantum] = combined
        return combined

    def weights_at(self, position: float) -> dict[str, float]:
        """The weights at ``position``, by source name."""
        return dict(zip(self.names, self.weights(self.quantum_of(position))))

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_weights"] = {}  # a worker reads the versions itself
        return state
