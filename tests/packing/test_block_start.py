"""BlockStart: the packs held after any number of a block's documents, rebuilt by a replay."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_tune_data.packing.block_start import BlockStart
from lightning_tune_data.packing.document_queue import DocumentQueue
from lightning_tune_data.packing.pieces import reference
from lightning_tune_data.packing.placement import PackPlacer
from packing_helpers import STRATEGIES


def _queue(lengths: list[int], first_row: int) -> DocumentQueue:
    refs = [reference("s", first_row + i, 0, n) for i, n in enumerate(lengths)]
    return DocumentQueue(refs, [np.arange(n) for n in lengths])


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("overlong", ["truncate", "drop"])
def test_a_replay_from_the_block_start_rebuilds_the_held_packs_of_every_moment(strategy, overlong):
    lengths = [int(n) for n in np.random.default_rng(8).integers(1, 90, size=300)]  # some longer than 64
    placer = PackPlacer(strategy, 64, 3, overlong, {"overlong_truncated": 0, "overlong_dropped": 0})
    placer.place_from(_queue(lengths[:40], 0), until_ready=2)  # packs held before the block
    handed_out = 0
    placer.ready.popleft()
    block = _queue(lengths[40:], 40)
    start = BlockStart(block, *placer.held_packs(), 7)
    moments = 0
    while block:
        placer.place_from(block, until_ready=2)
        while len(placer.ready) > 1:  # the stream hands packs out as it goes
            placer.ready.popleft()
            handed_out += 1
        packs, counts, num_open = placer.held_packs()
        replayed, replayed_open = start.replay(placer.like({"overlong_truncated": 0, "overlong_dropped": 0}),
                                               block.at, handed_out)
        assert replayed_open == num_open
        assert [pack.refs for pack in replayed] == [pack.refs[:count] for pack, count in zip(packs, counts)]
        moments += 1
    assert moments > 20


def test_a_replay_leaves_the_recorded_packs_as_they_were():
    placer = PackPlacer("best_fit", 32, 4, "truncate", {"overlong_truncated": 0, "overlong_dropped": 0})
    placer.place_from(_queue([10, 12, 7], 0), until_ready=5)
    block = _queue([5, 20, 3, 9], 3)
    start = BlockStart(block, *placer.held_packs(), 0)
    recorded = [list(pack.refs) for pack in start.packs]
    start.replay(placer.like({"overlong_truncated": 0, "overlong_dropped": 0}), 4, 0)
    assert [pack.refs for pack in start.packs] == recorded and block.at == 0
