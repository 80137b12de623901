"""The packer right after it queued a block: what a later snapshot replays placement from.

Placement depends only on the held packs and the documents placed, so the packs held after any
number of a block's documents are the packs held when the block was read plus a replay of those
documents. A snapshot taken while a block is placed records only how many documents were placed;
the state is built, by replaying, only when it is asked for.
"""

from __future__ import annotations

from typing import NamedTuple

from lightning_tune_data.packing.document_queue import DocumentQueue
from lightning_tune_data.packing.pack import Pack
from lightning_tune_data.packing.placement import PackPlacer

__all__ = ["BlockStart"]


class BlockStart(NamedTuple):
    """The packer right after it queued a block (see the module docstring); ``packs``,
    ``counts`` and ``num_open`` are what :meth:`PackPlacer.held_packs` returned then."""

    queue: DocumentQueue  # the block's documents
    packs: list[Pack]  # the open packs (oldest first), then the finished packs not handed out
    counts: list[int]  # how many pieces each of ``packs`` held then
    num_open: int
    packs_out: int  # packs handed out before the block

    def replay(self, placer: PackPlacer, placed: int, handed_out: int) -> tuple[list[Pack], int]:
        """The held packs after placing the block's first ``placed`` documents from this start and
        handing out ``handed_out`` packs since, and how many of them are open.

        Args:
            placer: a new placer with the packer's settings and stores (it is filled by the replay).
            placed: documents of the block placed at the snapshot.
            handed_out: packs handed out between the block start and the snapshot.
        """
        held = [pack.prefix(count) for pack, count in zip(self.packs, self.counts)]
        placer.set_open(held[: self.num_open])
        finished = held[self.num_open :]
        queue = self.queue.first(placed)
        while queue:
            placer.place_from(queue)
            finished.extend(placer.ready)
            placer.ready.clear()
        open_packs = list(placer.strategy.open.values())
        return open_packs + finished[handed_out:], len(open_packs)
