"""The weighted draw rule when the weights change over the run: :class:`ScheduledDraws`.

With fixed weights a child's lag is ``account / weight``. With weights that change, each child
also has a *target*: what the weights asked of it so far, accrued quantum by quantum of a
:class:`~lightning_tune_data.mixing.timeline.WeightTimeline` (``target += weight x drawn`` in the
mixture's unit). A child's lag is then ``(account - target) / weight``: within one quantum this
orders the children exactly as the fixed-weight rule would, so the draw costs the same; at a
quantum's end the targets take that quantum's share. A child at weight 0 is not drawn.

The state adds, to the accounts, the targets at the current quantum's start, the mixture's
drawn amount then (the *mark*), the quantum, its weights, and the clock's origin: O(children).
"""

from __future__ import annotations

import logging
import math
from typing import Any

from lightning_tune_data.distributed import current_shard
from lightning_tune_data.keys import MIX_BY, MixBy
from lightning_tune_data.mixing.schedule import BLOCK_SIZE, WEIGHTS_KEY, DrawSchedule
from lightning_tune_data.mixing.timeline import WeightTimeline
from lightning_tune_data.settings import StreamSettings

__all__ = ["ScheduledDraws", "TIMING_KEY", "SCHEDULED_JITTER_DRAWS"]

logger = logging.getLogger(__name__)

#: The jitter of a scheduled rule, in draws' worth (the fixed-weight rule's is ``JITTER_DRAWS``): smaller,
#: so that the realised shares follow a moving target closely over short stretches of the run.
SCHEDULED_JITTER_DRAWS = 8.0
#: State key of the scheduled rule's entries (see :meth:`ScheduledDraws.timing_state`).
TIMING_KEY = "timing"
_TARGETS, _MARK, _QUANTUM, _WEIGHTS = "targets", "mark", "quantum", "weights"
_ORIGIN, _PER_POSITION, _TIMELINE, _SCHEDULE = "origin", "counts_per_position", "timeline", "schedule"


class ScheduledDraws(DrawSchedule):
    """:class:`DrawSchedule` with weights from a timeline (see the module docstring).

    Args:
        mixture_name, names, mix_by, settings: as for :class:`DrawSchedule`.
        timeline: the weights per position, with the clock's unit.
    """

    def __init__(self, mixture_name: str, names: list[str], mix_by: MixBy, settings: StreamSettings,
                 timeline: WeightTimeline) -> None:
        if list(timeline.names) != list(names):
            raise ValueError(f"InterleavedDataset '{mixture_name}': the schedule names {timeline.names}, "
                             f"the mixture's children are {names}; give the schedule the children's names, in order.")
        self.timeline = timeline
        self.clock = MIX_BY.index(timeline.count)
        super().__init__(mixture_name, names, timeline.weights(0), mix_by, settings)

    @classmethod
    def or_fixed(cls, mixture_name: str, names: list[str], weights: list[float], mix_by: MixBy,
                 settings: StreamSettings, timeline: WeightTimeline | None) -> DrawSchedule:
        """The draw rule of a mixture: by ``timeline`` when given, else by the fixed ``weights``."""
        if timeline is None:
            return DrawSchedule(mixture_name, names, weights, mix_by, settings)
        return cls(mixture_name, names, mix_by, settings, timeline)

    def reset(self) -> None:
        """Back to no draws, empty accounts and targets, at the start of the run."""
        super().reset()
        self.total_documents = 0.0
        self.targets = [0.0] * len(self.names)
        self.mark = 0.0
        self.quantum = -1
        self.origin = [0.0, 0.0]  # (position, whole-run count) the clock counts from
        self.crossings: list[Any] | None = None  # a block reader's record of quantum changes
        self._next = -math.inf  # this shard's count at which the next quantum starts
        self._active: list[int] = list(range(len(self.names)))
        self._candidates: list[tuple[int, float]] = []

    def start_counting(self) -> None:
        """Sum the accounts (the clock and the token jitter read them), before any draw."""
        super().start_counting()
        self.total_documents = sum(account[0] for account in self.consumed)

    def load(self, draws: int, consumed: list[list[float]]) -> None:
        """Continue from ``draws`` draws with these accounts (the timing comes from :meth:`load_timing`)."""
        super().load(draws, consumed)
        self.start_counting()

    # -- the clock ----------------------------------------------------------------------------
    def amount(self, unit: int) -> float:
        """This shard's count of documents (``unit`` 0) or tokens (1) drawn so far."""
        return self.total_tokens if unit else self.total_documents

    def position(self) -> float:
        """Where the stream is, in the schedule's unit (see the timeline module)."""
        shards = current_shard(self.settings.rank, self.settings.world_size).num_shards
        return self.origin[0] + (self.amount(self.clock) * shards - self.origin[1]) / self.timeline.counts_per_position

    def _advance(self) -> None:
        """Enter the quantum of the current position (targets take the quantum left behind)."""
        shards = current_shard(self.settings.rank, self.settings.world_size).num_shards
        timeline = self.timeline
        quantum = timeline.quantum_of(self.position())
        scale = timeline.counts_per_position / shards
        amount = self.amount(self.clock)
        # Rounding: the count tests decide (the same ones on every run, exact or resumed).
        while quantum > 0 and amount < (timeline.boundaries[quantum] - self.origin[0]) * scale + self.origin[1] / shards:
            quantum -= 1
        while amount >= (timeline.end_of(quantum) - self.origin[0]) * scale + self.origin[1] / shards:
            quantum += 1
        if quantum != self.quantum:
            drawn = self.amount(self.unit)
            if self.quantum >= 0:
                self.targets = [t + w * (drawn - self.mark) for t, w in zip(self.targets, self.weights)]
            self.mark, self.quantum = drawn, quantum
            self.weights = list(timeline.weights(quantum))
            if not any(self.weights):
                raise RuntimeError(
                    f"InterleavedDataset '{self.mixture_name}': every source has reached its cap (max_epochs / "
                    f"max_tokens) at position {self.position():.6g} of the schedule; raise a cap or end the run earlier.")
            if self.crossings is not None:
                self.crossings.append((self.draws, self.timing_values()))
            self._candidates = self._weighted(self._active)
        self._next = (timeline.end_of(quantum) - self.origin[0]) * scale + self.origin[1] / shards

    # -- drawing ------------------------------------------------------------------------------
    def _weighted(self, active: list[int]) -> list[tuple[int, float]]:
        weighted = [(i, 1.0 / self.weights[i]) for i in active if self.weights[i] > 0]
        return weighted or [(i, 1.0) for i in active]

    def candidates(self, active: list[int]) -> list[tuple[int, float]]:
        """Remember which children may be drawn (the weights of the quantum decide among them)."""
        self._active = list(active)
        self._candidates = self._weighted(self._active)
        return self._candidates

    def draw(self, candidates: list[tuple[int, float]], uniforms: list[Any]) -> int:
        """One draw at the current position (``candidates`` is ignored: the quantum's own are used)."""
        if (self.total_tokens if self.clock else self.total_documents) >= self._next:
            self._advance()
        block, row = divmod(self.draws, BLOCK_SIZE)
        if block != uniforms[0]:
            uniforms[0], uniforms[1] = block, self.block_uniforms(block).tolist()
        index = self.choose(self._candidates, uniforms[1][row])
        self.draws += 1
        return index

    def choose(self, candidates: list[tuple[int, float]], jitter_row: list[float]) -> int:
        """The candidate with the smallest ``(account - target) / weight`` plus jitter."""
        unit = self.unit
        per_draw = 1.0
        if unit == 1 and self.draws:
            per_draw = max(1.0, self.total_tokens / self.draws)
        jitter = SCHEDULED_JITTER_DRAWS * per_draw
        consumed, targets = self.consumed, self.targets
        best, best_score = candidates[0][0], math.inf
        for i, inverse_weight in candidates:
            score = (consumed[i][unit] - targets[i]) * inverse_weight + jitter * jitter_row[i]
            if score < best_score:
                best, best_score = i, score
        return best

    def count(self, index: int, tokens: int) -> list[float]:
        """Add one drawn document of ``tokens`` tokens to child ``index``'s account (and the clock's sums)."""
        account = self.consumed[index]
        account[0] += 1
        account[1] += tokens
        self.total_tokens += tokens
        self.total_documents += 1
        return account

    # -- state --------------------------------------------------------------------------------
    def timing_values(self) -> list[Any]:
        """The timing as plain values (copied): targets, mark, quantum, weights, origin."""
        return [list(self.targets), self.mark, self.quantum, list(self.weights), list(self.origin)]

    def timing_state(self, values: list[Any] | None = None) -> dict[str, Any]:
        """The timing entries of the mixture's state (``values``: a :meth:`timing_values` record)."""
        targets, mark, quantum, weights, origin = values if values is not None else self.timing_values()
        timeline = self.timeline
        return {_TARGETS: dict(zip(self.names, targets)), _MARK: mark, _QUANTUM: quantum,
                _WEIGHTS: dict(zip(self.names, weights)), _ORIGIN: list(origin),
                _PER_POSITION: timeline.counts_per_position, _TIMELINE: timeline.fingerprint,
                _SCHEDULE: timeline.description}

    def load_saved(self, own: dict[str, Any]) -> None:
        """Continue from a mixture's saved state of this layout: accounts and timing."""
        super().load_saved(own)
        self.load_timing(own, 1)

    def state_entries(self, timing: list[Any] | None) -> dict[str, Any]:
        """The timing entry of the mixture's state (``timing``: a :meth:`timing_values` record)."""
        state = self.timing_state(timing)
        return {TIMING_KEY: state, WEIGHTS_KEY: dict(state[_WEIGHTS])}  # the weights in effect at that draw

    def merged(self, owns: list[dict[str, Any]]) -> dict[str, Any]:
        """The old shards' accounts and timing, merged (what a new layout splits)."""
        return {**super().merged(owns), TIMING_KEY: self.merged_timing(owns)}

    def warn_if_reweighted(self, own: dict[str, Any]) -> None:
        """Log that the checkpoint followed another schedule (the new one applies from the resume on)."""
        timing = own.get(TIMING_KEY)
        saved = None if timing is None else timing.get(_SCHEDULE)
        if saved != self.timeline.description:
            logger.warning(
                "InterleavedDataset '%s': the checkpoint was written with %s; resuming with another schedule, "
                "which applies from the resume's position on (the continuation differs from the saved run).",
                self.mixture_name, "fixed weights" if timing is None else "another mixture schedule")

    def saved_accounts(self, own: dict[str, Any]) -> list[list[float]]:
        """The saved accounts, always (they are the clock), even if the weights changed."""
        consumed = own.get("consumed", {})
        return [[float(consumed.get(n, {}).get(u, 0.0)) for u in MIX_BY] for n in self.names]

    def load_timing(self, own: dict[str, Any], shards: int) -> None:
        """Continue the timing of a saved state whose accounts were just loaded.

        The same timeline continues exactly; another one (another schedule, caps or batch) keeps
        what each child is owed and the position, and applies its weights from there on.

        Args:
            own: the mixture's saved state (or a merged one).
            shards: how many shards the accounts were split over (1 for a shard's own state).
        """
        timing = own.get(TIMING_KEY)
        self._next = -math.inf
        if timing is None:  # fixed weights before: every child owed nothing, the run's position kept
            self.targets = [account[self.unit] for account in self.consumed]
            self.mark, self.quantum, self.origin = self.amount(self.unit), -1, [0.0, 0.0]
            return
        targets = [float(timing[_TARGETS].get(n, 0.0)) for n in self.names]
        weights = [float(timing[_WEIGHTS].get(n, 0.0)) for n in self.names]
        mark, origin = float(timing[_MARK]) / shards, [float(v) for v in timing[_ORIGIN]]
        if shards == 1 and timing[_TIMELINE] == self.timeline.fingerprint:
            self.targets, self.mark, self.quantum, self.weights, self.origin = targets, mark, int(timing[_QUANTUM]), weights, origin
            self._candidates = self._weighted(self._active)
            return
        drawn = self.amount(self.unit)
        self.targets = [t / shards + w * (drawn - mark) for t, w in zip(targets, weights)]
        whole = self.amount(self.clock) * current_shard(self.settings.rank, self.settings.world_size).num_shards
        here = origin[0] + (whole - origin[1]) / float(timing[_PER_POSITION])
        self.mark, self.quantum, self.origin = drawn, -1, [here, whole]


    def merged_timing(self, owns: list[dict[str, Any]]) -> dict[str, Any] | None:
        """The old shards' timing summed: each shard's target brought up to what it drew, the
        marks summed (what a new layout splits; ``None`` when a shard had fixed weights)."""
        timings = [own.get(TIMING_KEY) for own in owns]
        if any(t is None for t in timings):
            return None
        unit = MIX_BY[self.unit]
        targets = [0.0] * len(self.names)
        marks = 0.0
        for own, timing in zip(owns, timings):
            drawn = sum(float(own["consumed"].get(n, {}).get(unit, 0.0)) for n in self.names)
            for i, n in enumerate(self.names):
                targets[i] += float(timing[_TARGETS].get(n, 0.0)) + float(timing[_WEIGHTS].get(n, 0.0)) * (
                    drawn - float(timing[_MARK]))
            marks += drawn
        return {**timings[0], _TARGETS: dict(zip(self.names, targets)), _MARK: marks, _QUANTUM: -1,
                _TIMELINE: ""}

    def take_share(self, merged: dict[str, Any]) -> None:
        """Start from this shard's equal part of a merged state, the schedule where it was."""
        super().take_share(merged)
        self.start_counting()
        shards = current_shard(self.settings.rank, self.settings.world_size).num_shards
        self.load_timing(merged, shards)
