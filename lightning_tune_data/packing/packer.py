"""``IterablePackedDataset``: pack document samples into sequences of at most ``max_seq_len`` tokens.

A *packed sample* is a read-only mapping (:class:`~lightning_tune_data.packing.pack.PackedSample`,
built on first access) of 1-D ``np.int64`` arrays of one common length ``n <= max_seq_len`` (not
padded: the collator pads) plus two lists:

* ``input_ids``: the documents' tokens, back to back;
* ``labels``: already shifted per document: ``labels[i]`` is the next token of the same document
  when that token is a training target (its ``loss_mask`` is ``True``, or there is no mask), else
  ``-100``; the last position of every document (piece) is ``-100``, so no label ever crosses a
  document boundary;
* ``position_ids``: restart at 0 at every document (piece);
* ``document_ids``: ``0..k-1``, the index of the document (piece) inside the pack;
* ``seq_lens``: ``list[int]``, length of every document (piece), in order;
* ``provenance``: ``list[dict]``, per document (piece): ``source``, ``epoch``, ``tokens`` (its
  tokens in this pack) and ``new_document`` (``False`` for the continuation of a document that
  started in an earlier pack, which only a strategy that splits documents produces).

Strategies (:mod:`lightning_tune_data.packing.strategies`, one class each, registered by name):
``"greedy"`` (next-fit), ``"best_fit"`` (the tightest of at most ``buffer_size`` open packs) and
``"concat"`` (documents back to back, cut into packs of exactly ``max_seq_len``). A strategy that
does not split documents never does; a document longer than ``max_seq_len`` is truncated to
``max_seq_len`` (``overlong="truncate"``) or dropped (``"drop"``), and counted. Empty documents
are dropped and counted.

Hot path: from a plain ``ArrowSource`` (no transforms, filter or loss mask), or a mixture of
them, the packer reads blocks of 2,048 documents as row references and positions in the source's
flat token array (no object per document), places them by length alone with the strategy's loop
over a block, and ``PackedCollator`` builds each batch from the packs' pieces in bulk. The
in-process train loader takes each batch's packs in one call (:meth:`PackStream.take
<lightning_tune_data.packing.stream.PackStream.take>`). The state after every pack records the
source's position right after the last packed document of the block, so documents read ahead and
not packed yet are read again on resume. Other children are read one document at a time
(:mod:`~lightning_tune_data.packing.intake`), with the same packs as the result.
:meth:`IterablePackedDataset.snapshot` records a position in microseconds and builds its state
only when asked; the train loader takes one after every batch.

Everything is deterministic given the input order. The state holds the open packs and the
queue of finished packs *by reference*: per piece its source, row, pass, token range and flags,
never token ids (plain lists, a few bytes per piece whatever ``max_seq_len`` is). Loading it
re-reads those documents from the sources, so a new object continues with exactly the packs the
original would have produced. Only documents that cannot be re-read (a streaming source's) keep
their tokens in the state. Resuming with another number of ranks or workers hands the pieces held
in every old shard's packs out to the new shards, which pack them first.

When a finite child ends, the open packs are emitted oldest first and the stream ends; the next
``iter()`` starts a new round.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from typing import Any

from lightning_tune_data.distributed import current_shard
from lightning_tune_data.keys import OVERLONG_POLICIES, ROW, OverlongPolicy
from lightning_tune_data.packing.intake import DocumentIntake
from lightning_tune_data.packing.pack import Pack
from lightning_tune_data.packing.packer_state import (
    CHILD,
    CHILD_EXHAUSTED,
    COUNTERS,
    FINISHED,
    HELD,
    MAX_SEQ_LEN,
    NUM_OPEN,
    PACKS,
    PENDING,
    PackerSnapshots,
    Snapshot,
)
from lightning_tune_data.packing.piece_state import concat_piece_states, packs_from_state, take_pieces
from lightning_tune_data.packing.progress import PackingProgress
from lightning_tune_data.packing.stream import PackStream
from lightning_tune_data.packing.strategies import STRATEGY, get_strategy, strategy_names
from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.base import TuneIterableDataset

__all__ = ["IterablePackedDataset", "PACKING_STRATEGIES"]

#: The registered strategies' names when this module was first imported (see ``strategy_names()``).
PACKING_STRATEGIES: tuple[str, ...] = strategy_names()


class IterablePackedDataset(TuneIterableDataset):
    """Pack the document samples of a stream into packed samples (see the module docstring).

    Args:
        dataset: the stream of document samples to pack.
        max_seq_len: the most tokens in one pack (may come from ``settings`` instead).
        strategy: the name of a registered packing strategy: ``"greedy"``, ``"best_fit"``
            (default) or ``"concat"``.
        buffer_size: open packs kept by ``"best_fit"`` (ignored by the other strategies).
        overlong: what a strategy that does not split documents does with a document longer than
            ``max_seq_len``: ``"truncate"`` (keep its first ``max_seq_len`` tokens; the default) or
            ``"drop"``.
        dataset_name: name of this stream; default ``packed_<child name>``.
        settings: the run's stream settings; when given, they supply ``max_seq_len`` (unless
            theirs is ``None``, e.g. sources of a strategy that splits documents, where the
            argument does) and ``overlong``, and an argument that contradicts them is an error.
    """

    def __init__(
        self,
        dataset: TuneIterableDataset,
        max_seq_len: int | None = None,
        strategy: str = "best_fit",
        buffer_size: int = 64,
        overlong: OverlongPolicy | None = None,
        dataset_name: str | None = None,
        *,
        settings: StreamSettings | None = None,
    ) -> None:
        max_seq_len, overlong = _packing_limits(max_seq_len, overlong, settings)
        get_strategy(strategy)  # an unknown name is an error listing the registered ones
        if overlong not in OVERLONG_POLICIES:
            raise ValueError(f"Unknown overlong policy {overlong!r}; choose one of {list(OVERLONG_POLICIES)}.")
        if isinstance(max_seq_len, bool) or not isinstance(max_seq_len, int) or max_seq_len < 1:
            raise ValueError(f"max_seq_len must be a positive int, got {max_seq_len!r}.")
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"buffer_size must be a positive int (open packs for best_fit), got {buffer_size!r}.")
        self._child = dataset
        self._dataset_name = dataset_name or f"packed_{dataset.dataset_name}"
        self._max_seq_len = max_seq_len
        self._strategy = strategy
        self._remaining: dict[str, Any] | None = None  # set by load_global_state, taken on first use
        self._progress = PackingProgress(strategy, max_seq_len, buffer_size, overlong)
        self._intake = DocumentIntake(self._progress, self._dataset_name, dataset.dataset_name, max_seq_len, overlong)
        self._snapshots = PackerSnapshots(dataset, self._dataset_name, max_seq_len)

    @property
    def dataset_name(self) -> str:
        """The name of this stream (the key of its state)."""
        return self._dataset_name

    @property
    def dataset(self) -> TuneIterableDataset:
        """The child stream."""
        return self._child

    @property
    def max_seq_len(self) -> int:
        """The most tokens in one pack."""
        return self._max_seq_len

    @property
    def strategy(self) -> str:
        """The packing strategy's name."""
        return self._strategy

    @property
    def counters(self) -> dict[str, int]:
        """Packs and tokens emitted, documents consumed, overlong/empty documents handled."""
        return dict(self._progress.counters)

    def _reads_blocks(self) -> bool:
        """Whether the child hands out blocks of document references (a plain ``ArrowSource``)."""
        supported = getattr(self._child, "blocks_supported", None)
        return supported is not None and bool(supported())

    # -- packs out -------------------------------------------------------------------------
    def __iter__(self) -> PackStream:
        """The packs, one at a time (``next``) or several at once (:meth:`PackStream.take`)."""
        return PackStream(self._progress, self._intake, self._child, self._start_round)

    def _start_round(self) -> tuple[bool, Iterator[dict[str, Any]] | None]:
        """Begin iterating: pack a resumed layout's held pieces, start a new round over a finished
        finite child; returns whether the child is read in blocks, and else its iterator."""
        self._resolve()
        progress = self._progress
        if progress.finished:  # new round over a finished finite child
            progress.finished = False
            progress.child_exhausted = False
        blocks = self._reads_blocks()
        return blocks, None if progress.child_exhausted or blocks else iter(self._child)

    # -- state -----------------------------------------------------------------------------
    def _packs_from_state(self, state: dict[str, Any]) -> list[Pack]:
        return packs_from_state(state, self._child.read_document, self._dataset_name)

    def _resolve(self) -> None:
        """Pack this shard's share of the pieces held by an old layout (on first use)."""
        if self._remaining is None:
            return
        remaining, self._remaining = self._remaining, None
        shard = current_shard(getattr(self._child, "rank", 0), getattr(self._child, "world_size", 1))
        progress = self._progress
        progress.drop_packs()
        if shard.shard_id == 0:
            progress.set_counters(remaining[COUNTERS])
        for pack in self._packs_from_state(take_pieces(remaining[HELD], shard.shard_id, shard.num_shards)):
            for piece in pack.pieces():
                progress.placer.add(*piece)

    def state_dict(self) -> dict[str, Any]:
        """The state after the last yielded pack: the held packs by reference, the counters, and
        the child's state (see :mod:`~lightning_tune_data.packing.packer_state`)."""
        # Built at once (a dataloader worker sends one after every batch): walking the held packs
        # costs less than replaying the block's placement, which only a snapshot that may never
        # be built should defer to.
        self._resolve()
        return self._snapshots.held(self._progress)()

    def snapshot(self) -> Snapshot:
        """A cheap record of the position after the last yielded pack; calling it returns
        :meth:`state_dict`'s result for that position.

        The loader takes one after every batch and builds the state only when a checkpoint asks.
        While the packer places the documents of a block, the record is the number of documents
        placed and the counters (no work per held pack): building the state replays the
        placement of those documents from the packs held when the block was read, which gives
        the same packs because placement depends only on the held packs and the documents.
        Otherwise (no block read yet, documents restored from an older state, the child ended)
        it records the held packs and their piece counts (packs only ever grow by appending).
        """
        self._resolve()
        progress = self._progress
        start = progress.block_start
        if start is not None and start.queue is progress.queue and not progress.child_exhausted:
            return self._snapshots.replayed(progress, start)
        return self._snapshots.held(progress)

    def _check_settings(self, own: dict[str, Any]) -> None:
        if own[STRATEGY] != self._strategy or own[MAX_SEQ_LEN] != self._max_seq_len:
            raise ValueError(
                f"Packer '{self._dataset_name}': the saved state was written with strategy="
                f"{own[STRATEGY]!r}, max_seq_len={own[MAX_SEQ_LEN]}, but this packer uses "
                f"strategy={self._strategy!r}, max_seq_len={self._max_seq_len}. Resume with the same "
                "packing settings, or start the data fresh (`resume_data_state: false`)."
            )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a state of :meth:`state_dict`: the child's position, and the held packs
        with their documents read again from the sources.

        Args:
            state_dict: a state this packer's settings wrote (the same strategy and ``max_seq_len``).
        """
        own = self._own_state(state_dict)
        self._check_settings(own)
        self._child.load_state_dict(own[CHILD])
        self._remaining = None
        self._progress.set_counters(own[COUNTERS])
        packs = self._packs_from_state(own[PACKS])
        pending = [] if own.get(PENDING) is None else self._packs_from_state(own[PENDING])
        num_open = own[NUM_OPEN]
        self._progress.restore(packs[:num_open], packs[num_open:], pending, bool(own[CHILD_EXHAUSTED]),
                               bool(own[FINISHED]))

    def merge_shard_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        """Every old shard's held pieces (open and finished packs) and merged child states.

        Args:
            states: the states of every shard of the old layout.
        """
        owns = [self._own_state(s) for s in states]
        for own in owns:
            self._check_settings(own)
        counters: dict[str, int] = collections.Counter()
        for own in owns:
            counters.update({k: int(v) for k, v in own[COUNTERS].items()})
            if own.get(PENDING):  # documents restored from an older state, not packed yet
                counters["documents"] += len(own[PENDING][ROW])
        return {
            self._dataset_name: {
                HELD: concat_piece_states([own[PACKS] for own in owns] + [own[PENDING] for own in owns if own.get(PENDING)]),
                COUNTERS: dict(counters),
                CHILD: self._child.merge_shard_states([own[CHILD] for own in owns]),
            }
        }

    def load_global_state(self, global_state: dict[str, Any]) -> None:
        """Continue from a merged state in a new layout: the child takes its share at once, this
        shard's share of the held pieces is packed first when iteration starts.

        Args:
            global_state: the result of :meth:`merge_shard_states`.
        """
        own = self._own_state(global_state)
        self._child.load_global_state(own[CHILD])
        self._remaining = own

    def read_document(self, source: str, row: int, epoch: int) -> dict[str, Any] | None:
        """The child's document ``row`` of ``source`` in pass ``epoch`` (``None`` when it has none)."""
        return self._child.read_document(source, row, epoch)


def _packing_limits(max_seq_len: int | None, overlong: OverlongPolicy | None,
                    settings: StreamSettings | None) -> tuple[int | None, str]:
    """The packer's ``max_seq_len`` and ``overlong``: from the arguments, or from ``settings``
    where they are given (an argument that contradicts them is an error)."""
    if settings is None:
        return max_seq_len, "truncate" if overlong is None else overlong
    if settings.max_seq_len is not None:
        if max_seq_len is not None and max_seq_len != settings.max_seq_len:
            raise ValueError(f"max_seq_len={max_seq_len!r} contradicts settings.max_seq_len={settings.max_seq_len}; "
                             "give one of them.")
        max_seq_len = settings.max_seq_len
    if overlong is not None and overlong != settings.overlong:
        raise ValueError(f"overlong={overlong!r} contradicts settings.overlong={settings.overlong!r}; give one of them.")
    return max_seq_len, settings.overlong
