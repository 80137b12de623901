"""Pass plans: shards split a pass exactly; merged and re-split states visit every remaining position once."""

from __future__ import annotations

import json
import random

import pytest

from lightning_tune_data.sources.pass_order import PassPlan, ShardPasses, merge_remaining, split_remaining


def walk(passes: ShardPasses, count: int) -> list[tuple[int, int]]:
    """Visit ``count`` positions: (pass, position) pairs, moving to the next pass when one is done."""
    seen = []
    while len(seen) < count:
        if passes.plan.done:
            passes.next_pass()
            continue
        position = int(passes.plan.upcoming(1)[0])
        passes.plan.advance()
        seen.append((passes.epoch, position))
    return seen


def test_shards_of_a_fresh_layout_split_a_pass_into_equal_disjoint_strides():
    n, shards = 103, 4
    seen = [p for s in range(shards) for p in walk(ShardPasses(n, shards, s), n // shards)]
    assert sorted(pos for _, pos in seen) == sorted(set(pos for _, pos in seen))
    assert len(seen) == shards * (n // shards)
    assert all(pos < shards * (n // shards) for _, pos in seen)  # the n % shards remainder is left out


@pytest.mark.parametrize("trial", range(40))
def test_merge_and_resplit_visits_every_remaining_position_exactly_once(trial):
    rng = random.Random(trial)
    n = rng.randint(30, 400)
    layouts = [rng.randint(1, 6) for _ in range(rng.randint(2, 4))]  # several resumes with other layouts
    seen: list[tuple[int, int]] = []
    states = [ShardPasses(n, layouts[0], s).state_dict() for s in range(layouts[0])]
    remaining = None
    for index, shards in enumerate(layouts):
        if index:
            remaining = merge_remaining(states, "src")
            json.dumps(remaining)  # plain types
        walks = [split_remaining(remaining, n, shards, s) if remaining else ShardPasses.from_state(states[s])
                 for s in range(shards)]
        for w in walks:  # uneven progress, sometimes into the next pass
            seen += walk(w, rng.randint(0, 2 * n // shards + 1))
        states = [w.state_dict() for w in walks]
    # finish: drain passes 0 and 1 on a last layout
    final = [split_remaining(merge_remaining(states, "src"), n, 3, s) for s in range(3)]
    for w in final:
        while w.epoch < 2:
            if w.plan.done:
                w.next_pass()
                continue
            seen += walk(w, 1)
    for epoch in (0, 1):
        positions = [p for e, p in seen if e == epoch]
        assert len(positions) == len(set(positions)), f"pass {epoch}: a position was visited twice"
        ends = {plan_end for plan_end in (layouts[0] * (n // layouts[0]),)}
        if epoch == 0:
            assert set(positions) == set(range(max(ends))), "pass 0: a position was lost"


def test_a_state_from_an_incomplete_set_of_shards_is_refused():
    states = [ShardPasses(50, 3, s).state_dict() for s in (0, 2)]
    with pytest.raises(ValueError, match="not one state per shard"):
        merge_remaining(states, "src")


def test_plan_state_round_trips():
    plan = PassPlan(epoch=2, base=10, stride=3, offset=1, end=40, holes=[4, 7])
    plan.advance()
    again = PassPlan.from_state(json.loads(json.dumps(plan.state_dict())))

    def rest(p):
        out = []
        while not p.done:
            out.append(int(p.upcoming(1)[0]))
            p.advance()
        return out

    assert rest(again) == rest(plan) == [7, 11, 14, 17, 20, 23, 26, 29, 32, 35, 38]


@pytest.mark.parametrize("count", [0, 1, 2, 3, 5, 9])
def test_a_saved_walk_advanced_in_place_equals_the_walk_advanced_then_saved(count):
    plans = [PassPlan(epoch=2, base=10, stride=3, offset=1, end=40, holes=[4, 7, 8]),
             PassPlan(epoch=3, base=0, stride=3, offset=0, end=40, holes=[])]
    walk_ = ShardPasses(60, 3, 1, plans)
    walk_.plan.advance(1)  # one hole already taken
    saved = walk_.state_dict()
    before = json.loads(json.dumps(saved))
    walk_.plan.advance(count)  # the holes first, then the strided tail
    assert ShardPasses.state_advanced(saved, count) == walk_.state_dict()
    assert saved == before  # the saved state itself is untouched


def test_a_walks_snapshot_built_later_equals_its_state_at_that_moment():
    plans = [PassPlan(epoch=2, base=10, stride=3, offset=1, end=40, holes=[4, 7, 8]),
             PassPlan(epoch=3, base=0, stride=3, offset=0, end=40, holes=[5])]
    walk_ = ShardPasses(60, 3, 1, plans)
    moments = []
    for _ in range(40):  # through the holes, the tail, the queued pass and a fresh pass
        moments.append((walk_.snapshot(), json.loads(json.dumps(walk_.state_dict()))))
        walk(walk_, 1)
    assert walk_.epoch == 4
    for snapshot, expected in moments:
        assert snapshot() == expected
