"""The iterator over a packer's packs, one at a time or a batch's worth at once."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator
from typing import Any

from lightning_tune_data.packing.document_queue import DocumentQueue
from lightning_tune_data.packing.intake import DocumentIntake
from lightning_tune_data.packing.pack import Pack, PackedSample
from lightning_tune_data.packing.placement import BlockPlacement
from lightning_tune_data.packing.progress import PackingProgress
from lightning_tune_data.sources.base import TuneIterableDataset

__all__ = ["PackStream", "RoundStart"]

#: Begins a round of the packer: returns whether the child is read in blocks, and else its iterator.
RoundStart = Callable[[], "tuple[bool, Iterator[dict[str, Any]] | None]"]


class PackStream:
    """The iterator over a packer's packs: ``next`` hands out one :class:`PackedSample`,
    :meth:`take` a batch's worth at once.

    Taking ``count`` packs places documents until ``count`` packs are finished and hands them out
    together: the same packs, in the same order, and the same state after them as ``count``
    calls of ``next``, without a step per pack in between. The in-process train loader takes
    every batch this way.

    Args:
        progress: the packer's position, moved as packs are placed and handed out.
        intake: places the child's documents one at a time (a child that hands out no blocks).
        child: the packer's child, read in blocks when it hands them out.
        start_round: begins the round at the first pack asked for.
    """

    __slots__ = ("_progress", "_intake", "_child", "_start_round", "_started", "_blocks", "_child_it", "_queue",
                 "_place", "_unusable", "_ended")

    def __init__(self, progress: PackingProgress, intake: DocumentIntake, child: TuneIterableDataset,
                 start_round: RoundStart) -> None:
        self._progress = progress
        self._intake = intake
        self._child = child
        self._start_round = start_round
        self._started = False  # the round begins at the first pack asked for, as a generator's would
        self._blocks = False
        self._child_it: Iterator[dict[str, Any]] | None = None
        self._queue: DocumentQueue | None = None  # the queue ``_place`` was looked up for
        self._place: BlockPlacement | None = None
        self._unusable = 0  # documents in a row that could not be packed
        self._ended = False

    def __iter__(self) -> PackStream:
        return self

    def __next__(self) -> PackedSample:
        ready = self._filled(1)
        if not ready:
            raise StopIteration
        pack = ready.popleft()
        counters = self._progress.counters
        counters["packs"] += 1
        counters["tokens"] += pack.length
        return PackedSample(pack)

    def take(self, count: int) -> list[PackedSample]:
        """The next up to ``count`` packs; fewer only when a finite child has ended (then the
        round is over, and later calls return ``[]``).

        Args:
            count: packs to hand out.
        """
        ready = self._filled(count)
        taken = min(count, len(ready))
        packs = [PackedSample(ready.popleft()) for _ in range(taken)]
        counters = self._progress.counters
        counters["packs"] += taken
        counters["tokens"] += sum(sample.pack.length for sample in packs)
        return packs

    def _filled(self, count: int) -> collections.deque[Pack]:
        """The finished packs after placing documents until there are ``count`` (or the child
        ended: then, with fewer, the round is over)."""
        if self._ended:
            return collections.deque()
        progress = self._progress
        if not self._started:
            self._started = True
            self._blocks, self._child_it = self._start_round()
        placer = progress.placer
        ready = placer.ready
        if len(ready) >= count:
            return ready
        counters = progress.counters
        while len(ready) < count and not progress.child_exhausted:
            if not self._blocks:
                self._unusable = self._intake.place_next(self._child_it, self._unusable)
                continue
            queue = progress.queue
            if queue is not self._queue:  # a new block (or documents restored from a state)
                self._queue, self._place = queue, placer.placement_for(queue)
            if queue.at < len(queue.refs):  # place queued documents until the packs are ready; the state holds the rest
                counters["documents"] += self._place(queue, count)
            elif not progress.read_block(self._child):
                progress.end_child()
        if len(ready) < count:  # the child ended: the round is over once these are out
            progress.finished = True
            self._ended = True
        return ready
