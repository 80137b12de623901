"""Which positions of a pass each shard visits, as a small, index-only, layout-portable state.

Mental model. Pass ``e`` over a source of ``n`` rows is an order of *positions* ``0..n-1``; a
keyed permutation maps a position to a row (see ``permutation.py``). The ``S`` shards of a run
(``world_size × num_workers``) split a pass by striding: shard ``t`` visits positions
``t, t+S, t+2S, …`` below ``end = S·(n // S)`` (every shard gets the same count; the ``n % S``
positions past ``end`` are left out of that pass). A shard's progress is one integer.

Elastic resume. When a run resumes with a different number of shards, the unvisited rest of the
pass in progress is rebuilt from every old shard's progress: shard ``t`` visited ``k_t`` of its
positions, so everything at or above ``base = S·max(k)`` is unvisited, and below it the
unvisited positions are an explicit, short list of *holes* (``Σ (max(k) - k_t)`` of them). New
shard ``u`` of ``S'`` visits ``holes[u::S']`` first, then ``base + u, base + u + S', …`` below
the same ``end``. Passes some old shards had already started while others had not finished the
previous one are rebuilt the same way, so across the old and the resumed run every position of
those passes is visited exactly once. Later passes use the new layout from scratch.

A :class:`PassPlan` is one shard's walk through one pass (holes, then a strided tail);
:class:`ShardPasses` is a shard's walk through all passes (the current plan, plans queued for
the next passes after an elastic resume, then fresh passes). :func:`merge_remaining` and
:func:`split_remaining` turn the old shards' states into the new shards' plans.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["PassPlan", "ShardPasses", "merge_remaining", "split_remaining"]

# State keys.
PASS_EPOCH = "epoch"
HOLES = "holes"
BASE = "base"
STRIDE = "stride"
OFFSET = "offset"
END = "end"
TAIL_TAKEN = "tail_taken"
PLAN = "plan"
PENDING = "pending"
NUM_ITEMS = "num_rows"
NUM_SHARDS = "num_shards"
SHARD_ID = "shard_id"


@dataclass
class PassPlan:
    """One shard's walk through one pass: ``holes`` first, then ``base + offset + stride·j < end``."""

    epoch: int
    base: int
    stride: int
    offset: int
    end: int
    holes: list[int] = field(default_factory=list)
    holes_taken: int = 0
    tail_taken: int = 0

    @classmethod
    def fresh(cls, epoch: int, num_items: int, num_shards: int, shard_id: int) -> PassPlan:
        """A pass of the layout from its start: every ``num_shards``-th position from ``shard_id``."""
        return cls(epoch=epoch, base=0, stride=num_shards, offset=shard_id, end=num_shards * (num_items // num_shards))

    @property
    def tail_length(self) -> int:
        """Positions of the strided tail (after the holes)."""
        first = self.base + self.offset
        return 0 if first >= self.end else (self.end - first + self.stride - 1) // self.stride

    def __len__(self) -> int:
        """Positions of the whole plan: holes and tail."""
        return len(self.holes) + self.tail_length

    @property
    def taken(self) -> int:
        """Positions visited so far."""
        return self.holes_taken + self.tail_taken

    @property
    def done(self) -> bool:
        """Whether every position of the plan was visited."""
        return self.taken >= len(self)

    @property
    def untouched_fresh(self) -> bool:
        """A whole pass of a layout, not started (the no-data guard only judges such passes)."""
        return self.base == 0 and not self.holes and self.taken == 0

    def upcoming(self, limit: int) -> np.ndarray:
        """The next up to ``limit`` positions, without advancing."""
        if self.holes_taken < len(self.holes):
            return np.asarray(self.holes[self.holes_taken : self.holes_taken + limit], dtype=np.int64)
        count = min(limit, self.tail_length - self.tail_taken)
        start = self.base + self.offset + self.stride * self.tail_taken
        return start + self.stride * np.arange(max(count, 0), dtype=np.int64)

    def advance(self, count: int = 1) -> None:
        """Mark the next ``count`` positions visited (holes first, then the tail)."""
        from_holes = min(count, len(self.holes) - self.holes_taken)
        self.holes_taken += from_holes
        self.tail_taken += count - from_holes

    def remaining_holes(self) -> list[int]:
        """The holes not visited yet, in order."""
        return self.holes[self.holes_taken :]

    def state_dict(self) -> dict[str, Any]:
        """The plan now, as plain ints and lists."""
        return self.state_at(self.holes_taken, self.tail_taken)

    def state_at(self, holes_taken: int, tail_taken: int) -> dict[str, Any]:
        """The state of this plan when it had visited ``holes_taken`` holes and ``tail_taken`` tail
        positions (a plan only ever advances those two counts)."""
        return {
            PASS_EPOCH: self.epoch,
            HOLES: self.holes[holes_taken:],
            BASE: self.base,
            STRIDE: self.stride,
            OFFSET: self.offset,
            END: self.end,
            TAIL_TAKEN: tail_taken,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> PassPlan:
        """The plan a :meth:`state_dict` result describes (the holes visited are gone from it)."""
        return cls(
            epoch=int(state[PASS_EPOCH]),
            base=int(state[BASE]),
            stride=int(state[STRIDE]),
            offset=int(state[OFFSET]),
            end=int(state[END]),
            holes=[int(h) for h in state[HOLES]],
            tail_taken=int(state.get(TAIL_TAKEN, 0)),
        )


class ShardPasses:
    """A shard's walk through the passes of one source: current plan, queued plans, then fresh passes.

    Args:
        num_items: rows of the source.
        num_shards: shards of the layout (``world_size × num_workers``).
        shard_id: this shard.
        plans: plans to walk first (after an elastic resume), in pass order; ``None`` starts
            at pass 0 of the layout.
    """

    def __init__(self, num_items: int, num_shards: int, shard_id: int, plans: list[PassPlan] | None = None) -> None:
        self.num_items = num_items
        self.num_shards = num_shards
        self.shard_id = shard_id
        plans = list(plans or [PassPlan.fresh(0, num_items, num_shards, shard_id)])
        self.plan = plans[0]
        self.pending = plans[1:]

    @property
    def epoch(self) -> int:
        """The pass being walked."""
        return self.plan.epoch

    def next_pass(self) -> None:
        """Move to the next pass: a queued plan, or the layout's fresh pass."""
        following = self.plan.epoch + 1
        if self.pending and self.pending[0].epoch == following:
            self.plan = self.pending.pop(0)
        else:
            self.plan = PassPlan.fresh(following, self.num_items, self.num_shards, self.shard_id)

    def state_dict(self) -> dict[str, Any]:
        """The walk now: the layout, the current plan and the queued ones."""
        return self.snapshot()()

    def snapshot(self) -> Callable[[], dict[str, Any]]:
        """A record of the walk's position now, taken in about a microsecond; calling it returns
        :meth:`state_dict`'s result for that position (the current plan only advances its counts,
        a new pass replaces it, and queued plans are recorded as they are)."""
        plan, holes_taken, tail_taken = self.plan, self.plan.holes_taken, self.plan.tail_taken
        pending = [queued.state_dict() for queued in self.pending] if self.pending else []
        num_items, num_shards, shard_id = self.num_items, self.num_shards, self.shard_id

        def build() -> dict[str, Any]:
            return {
                NUM_ITEMS: num_items,
                NUM_SHARDS: num_shards,
                SHARD_ID: shard_id,
                PLAN: plan.state_at(holes_taken, tail_taken),
                PENDING: [dict(queued) for queued in pending],
            }

        return build

    @staticmethod
    def state_advanced(state: dict[str, Any], count: int) -> dict[str, Any]:
        """A saved walk moved on by ``count`` positions of its current pass (as
        :meth:`PassPlan.advance` would), without rebuilding it."""
        plan = state[PLAN]
        holes = plan[HOLES]
        from_holes = min(count, len(holes))
        plan = {**plan, HOLES: holes[from_holes:], TAIL_TAKEN: int(plan.get(TAIL_TAKEN, 0)) + count - from_holes}
        return {**state, PLAN: plan}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ShardPasses:
        """The walk a :meth:`state_dict` result describes."""
        plans = [PassPlan.from_state(state[PLAN])] + [PassPlan.from_state(p) for p in state.get(PENDING, [])]
        return cls(int(state[NUM_ITEMS]), int(state[NUM_SHARDS]), int(state[SHARD_ID]), plans)


def _plan_of(walk: ShardPasses, epoch: int) -> PassPlan | None:
    """The shard's plan for ``epoch`` with its progress; ``None`` if the shard finished that pass."""
    if walk.epoch > epoch:
        return None
    if walk.epoch == epoch:
        return walk.plan
    for plan in walk.pending:
        if plan.epoch == epoch:
            return plan
    return PassPlan.fresh(epoch, walk.num_items, walk.num_shards, walk.shard_id)


def merge_remaining(states: list[dict[str, Any]], source: str = "source") -> list[dict[str, Any]]:
    """What is left unvisited of every pass the old shards were in, from all old shards' states.

    Args:
        states: :meth:`ShardPasses.state_dict` of every old shard, any order.
        source: the source's name, for error messages.

    Returns:
        One entry per pass from the earliest unfinished one: ``{"epoch", "holes" (sorted
        positions), "base", "end"}``; every position in ``holes`` or in ``[base, end)`` is
        unvisited, every other position below ``end`` was visited.
    """
    walks = sorted((ShardPasses.from_state(s) for s in states), key=lambda w: w.shard_id)
    num_shards = walks[0].num_shards
    if [w.shard_id for w in walks] != list(range(num_shards)) or any(w.num_shards != num_shards for w in walks):
        raise ValueError(
            f"Source '{source}': the checkpoint holds shards {[w.shard_id for w in walks]} of "
            f"{sorted({w.num_shards for w in walks})}, not one state per shard; the data state is incomplete."
        )
    first = min(w.epoch for w in walks)
    last = max([w.epoch for w in walks] + [p.epoch for w in walks for p in w.pending])
    remaining = []
    for epoch in range(first, last + 1):
        plans = [_plan_of(w, epoch) for w in walks]
        live = [p for p in plans if p is not None]
        base, stride, end = live[0].base, live[0].stride, live[0].end
        if any((p.base, p.stride, p.end) != (base, stride, end) for p in live) or stride != num_shards:
            raise ValueError(f"Source '{source}': the shards' saved plans for pass {epoch} disagree; the data state is corrupt.")
        holes: list[int] = []
        taken = []
        for shard_id, plan in enumerate(plans):
            if plan is None:  # this shard finished the pass
                tail = PassPlan(epoch, base, stride, shard_id, end)
                taken.append(tail.tail_length)
            else:
                holes.extend(plan.remaining_holes())
                taken.append(plan.tail_taken)
        most = max(taken)
        for shard_id, count in enumerate(taken):
            positions = base + shard_id + stride * np.arange(count, most, dtype=np.int64)
            holes.extend(positions[positions < end].tolist())
        remaining.append({PASS_EPOCH: epoch, HOLES: sorted(holes), BASE: min(base + stride * most, end), END: end})
    return remaining


def split_remaining(remaining: list[dict[str, Any]], num_items: int, num_shards: int, shard_id: int) -> ShardPasses:
    """Shard ``shard_id`` of ``num_shards``'s walk over the remaining passes, then fresh passes."""
    plans = [
        PassPlan(
            epoch=int(entry[PASS_EPOCH]),
            base=int(entry[BASE]),
            stride=num_shards,
            offset=shard_id,
            end=int(entry[END]),
            holes=list(entry[HOLES][shard_id::num_shards]),
        )
        for entry in remaining
    ]
    return ShardPasses(num_items, num_shards, shard_id, plans or None)
