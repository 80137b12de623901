"""A packer's saved state: its keys, and the snapshots it is built from.

``state_dict()`` of a packer named ``name`` is ``{name: state}`` where ``state`` holds the
strategy's entries (its name), :data:`MAX_SEQ_LEN`, :data:`COUNTERS`, :data:`NUM_OPEN` (how many
of the held packs are open), :data:`CHILD_EXHAUSTED`, :data:`FINISHED`, :data:`CHILD` (the child's
state: after the last placed document of the block being placed, so documents read ahead are
read again), :data:`PACKS` (the held packs, open ones first, by reference) and, for documents
restored from an older state and not placed yet, :data:`PENDING`. A merged state (elastic
resume) holds :data:`HELD` (every old shard's pieces), the summed :data:`COUNTERS` and the
merged :data:`CHILD`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_tune_data.packing.block_start import BlockStart
from lightning_tune_data.packing.piece_state import held_state, pending_state
from lightning_tune_data.packing.progress import PackingProgress
from lightning_tune_data.packing.strategies import PackingStrategy
from lightning_tune_data.sources.base import TuneIterableDataset

__all__ = [
    "CHILD",
    "CHILD_EXHAUSTED",
    "COUNTERS",
    "FINISHED",
    "HELD",
    "MAX_SEQ_LEN",
    "NUM_OPEN",
    "PACKS",
    "PENDING",
    "PackerSnapshots",
]

MAX_SEQ_LEN = "max_seq_len"
COUNTERS = "counters"
NUM_OPEN = "num_open"
CHILD_EXHAUSTED = "child_exhausted"
FINISHED = "finished"
CHILD = "child"
PACKS = "packs"
PENDING = "pending"
HELD = "held"

Snapshot = Callable[[], dict[str, Any]]


class PackerSnapshots:
    """Cheap records of a packer's position, each building the packer's state when called.

    Args:
        child: the packer's child stream.
        name: the packer's name (the key of its state).
        max_seq_len: the packer's pack length (saved, a state loads only with the same).
    """

    def __init__(self, child: TuneIterableDataset, name: str, max_seq_len: int) -> None:
        self.child = child
        self.name = name
        self.max_seq_len = max_seq_len

    def header(self, strategy: PackingStrategy, counters: dict[str, int], num_open: int, child_exhausted: bool,
               finished: bool) -> dict[str, Any]:
        """The entries of a state before its packs.

        Args:
            strategy: the packer's strategy (its own entries come first).
            counters: the counters at the snapshot.
            num_open: how many of the held packs are open.
            child_exhausted: whether the child had ended.
            finished: whether the round was over.
        """
        return {**strategy.state(), MAX_SEQ_LEN: self.max_seq_len, COUNTERS: counters, NUM_OPEN: num_open,
                CHILD_EXHAUSTED: child_exhausted, FINISHED: finished}

    def held(self, progress: PackingProgress) -> Snapshot:
        """The snapshot that records every held pack and its current piece count.

        Args:
            progress: the packer's position now.
        """
        placer = progress.placer
        packs, counts, num_open = placer.held_packs()
        queue = progress.queue
        block, placed = queue.block, queue.at
        recorded = (placer.strategy, dict(progress.counters), num_open, progress.child_exhausted, progress.finished)
        child_state = pending = None
        if block is None:  # no block read yet, or documents restored from an older state: saved as documents
            child_state = self.child.state_dict()
            if len(queue):
                pending = (queue.refs, queue.tokens, queue.extras, placed)

        def build() -> dict[str, Any]:
            state = self.header(*recorded)
            if child_state is not None:
                state[CHILD] = child_state
            state[PACKS] = held_state(packs, counts)
            if pending is not None:
                state[PENDING] = pending_state(*pending)
            if block is not None:  # the source's position after the last placed document of its block
                state[CHILD] = self.child.state_after_block(block, placed)
            return {self.name: state}

        return build

    def replayed(self, progress: PackingProgress, start: BlockStart) -> Snapshot:
        """The snapshot after the documents of ``start``'s block placed so far: the counters and
        the number placed are recorded; the held packs are rebuilt by a replay when it is called.

        Args:
            progress: the packer's position now.
            start: the start of the block being placed.
        """
        placer, placed = progress.placer, start.queue.at
        counters, finished = dict(progress.counters), progress.finished  # all that changes while a block is placed

        def build() -> dict[str, Any]:
            packs, num_open = start.replay(placer.like(dict(counters)), placed, counters["packs"] - start.packs_out)
            state = self.header(placer.strategy, counters, num_open, False, finished)
            state[PACKS] = held_state(packs, [len(pack.refs) for pack in packs])
            state[CHILD] = self.child.state_after_block(start.queue.block, placed)
            return {self.name: state}

        return build
