"""Where a packer is: its packs, the block being placed, its counters, and how far its round got.

:class:`PackingProgress` is the packer's whole mutable position in one object: the
:class:`~lightning_tune_data.packing.placement.PackPlacer` (open and finished packs), the
:class:`~lightning_tune_data.packing.document_queue.DocumentQueue` of the block being placed and
the :class:`~lightning_tune_data.packing.block_start.BlockStart` recorded when it was read, the
counters, and whether the child ended and the round is over. The packer's iterator moves it; its
state is built from it.
"""

from __future__ import annotations

from typing import Any

from lightning_tune_data.keys import OverlongPolicy
from lightning_tune_data.packing.block_start import BlockStart
from lightning_tune_data.packing.document_queue import DocumentQueue
from lightning_tune_data.packing.pack import Pack
from lightning_tune_data.packing.pieces import detach_pieces
from lightning_tune_data.packing.placement import PackPlacer
from lightning_tune_data.sources.base import TuneIterableDataset

__all__ = ["COUNTER_NAMES", "PackingProgress", "read_ahead_documents"]

#: What a packer counts: packs and tokens handed out, documents read, documents cut or dropped.
COUNTER_NAMES = ("packs", "documents", "tokens", "overlong_truncated", "overlong_dropped", "empty_dropped")
#: Documents read from the child at a time when it hands out blocks (held by reference until packed).
_BLOCK_DOCUMENTS = 2048


def read_ahead_documents() -> int:
    """Documents a packer reads from a mixture ahead of the packs it hands out (one block's worth)."""
    return _BLOCK_DOCUMENTS


class PackingProgress:
    """A packer's position: packs, the block being placed, counters, end of child and round.

    Args:
        strategy: the registered name of the packing strategy.
        max_seq_len: the most tokens in one pack.
        buffer_size: open packs kept by a strategy that keeps several.
        overlong: what happens to a document longer than ``max_seq_len`` (``"truncate"``/``"drop"``).
    """

    def __init__(self, strategy: str, max_seq_len: int, buffer_size: int, overlong: OverlongPolicy) -> None:
        self.counters = dict.fromkeys(COUNTER_NAMES, 0)
        self.placer = PackPlacer(strategy, max_seq_len, buffer_size, overlong, self.counters)
        self.queue = DocumentQueue()  # documents read in a block, not placed yet (block reading only)
        self.block_start: BlockStart | None = None  # the packer when ``queue``'s block was read
        self.child_exhausted = False
        self.finished = False  # the round is over: the child ended and every pack was handed out

    def read_block(self, child: TuneIterableDataset) -> bool:
        """Queue the child's next block of documents; ``False`` when the child has ended.

        Args:
            child: a stream that hands out blocks of document references.
        """
        block = child.read_block(_BLOCK_DOCUMENTS)
        if block is None:
            return False
        self.placer.stores.update(block.stores)
        references = block.references()
        self._detach_released(references, block.tokens)
        self.queue = DocumentQueue(references, block.tokens, block=block)
        self.block_start = BlockStart(self.queue, *self.placer.held_packs(), self.counters["packs"])
        return True

    def _detach_released(self, references: list[tuple], tokens: list[Any]) -> None:
        """Copy out the pieces of shards a source read shard by shard has let go of: those the
        open packs hold, and those of the block just read (a read of many documents walks several
        windows). The node's cache may then evict those shards, and no reader holds them between
        batches (a copy of a document costs less than fetching its shard again).

        Args:
            references, tokens: the block just read's piece references and tokens.
        """
        holders = None  # built only when a source let go of shards (windowed stores only)
        for name, store in self.placer.stores.items():
            released = getattr(store, "released_shards", None)
            shards = released() if released is not None else None
            if shards:
                if holders is None:
                    holders = [(pack.refs, pack.tokens) for pack in self.placer.held_packs()[0]] + [(references, tokens)]
                detach_pieces(holders, name, shards, store.flat_tokens())
                store.copied_out()

    def end_child(self) -> None:
        """The child ended: every open pack that holds tokens is finished."""
        self.child_exhausted = True
        self.placer.close_all()

    def drop_packs(self) -> None:
        """Forget every held pack and queued document (a resumed layout's pieces are placed anew)."""
        self.placer.set_open([])
        self.placer.ready.clear()
        self.queue, self.block_start = DocumentQueue(), None

    def set_counters(self, counters: dict[str, Any]) -> None:
        """Replace the counters' values (in place: the placer counts into the same dict)."""
        self.counters.clear()
        self.counters.update({k: int(v) for k, v in counters.items()})

    def restore(self, open_packs: list[Pack], finished_packs: list[Pack], pending: list[Pack],
                child_exhausted: bool, finished: bool) -> None:
        """Set the position a saved state describes (nothing to replay until the next block).

        Args:
            open_packs: the open packs, oldest first.
            finished_packs: the finished packs not handed out yet.
            pending: packs of documents read and not placed yet (from an older state's queue).
            child_exhausted: whether the child had ended.
            finished: whether the round was over.
        """
        self.placer.set_open(open_packs)
        self.placer.ready.clear()
        self.placer.ready.extend(finished_packs)
        pieces = [piece for pack in pending for piece in pack.pieces()]
        self.queue = DocumentQueue([p[0] for p in pieces], [p[1] for p in pieces], [p[2] for p in pieces])
        self.block_start = None
        self.child_exhausted = child_exhausted
        self.finished = finished
