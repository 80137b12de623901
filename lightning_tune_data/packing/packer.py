"""``IterablePackedDataset``: pack document samples into sequences of at most ``max_seq_len`` tokens.

A *packed sample* is a read-only mapping (:class:`PackedSample`, built on first access) of 1-D
``np.int64`` arrays of one common length ``n <= max_seq_len`` (not padded: the collator pads)
plus two lists:

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
  started in an earlier pack, which only ``"concat"`` produces).

Strategies:

* ``"greedy"``: next-fit. One open pack; a document that does not fit closes it.
* ``"best_fit"``: best-fit over at most ``buffer_size`` open packs. Each document goes into the
  open pack with the least free space that still holds it (oldest on ties); if none holds it, it
  opens a new pack; when more than ``buffer_size`` packs are open, the fullest (oldest on ties) is
  emitted. A pack that becomes exactly full is emitted at once. With ``buffer_size=64`` this fills
  >= 99% of the tokens of packs of 2048 with log-normal document lengths of mean ~300. A document
  can wait while its pack fills, but at most ``buffer_size`` packs are ever held.
* ``"concat"``: pretraining style. Documents (which already carry BOS/EOS) are concatenated and cut
  into blocks of exactly ``max_seq_len`` tokens; the part of a document that does not fit is
  carried into the next block, so no token is dropped. Every piece is its own "document" in the
  pack (positions restart, last label ``-100``).

In ``greedy``/``best_fit`` a document is never split; one longer than ``max_seq_len`` is
truncated to ``max_seq_len`` (``overlong="truncate"``) or dropped (``"drop"``), and counted.
Empty documents are dropped and counted.

Hot path: from a plain ``ArrowSource`` (no transforms, filter or loss mask), or a mixture of
them, the packer reads blocks of 2,048 documents as row references and positions in the source's
flat token array (no object per document), places them by length alone
(``pack_placement.py``: a run of whole documents at once for ``concat``), and
``PackedCollator`` builds each batch from the packs' pieces in bulk (one join of the tokens' byte
ranges and padding, labels by one shift plus a mask at piece ends, ids by repeat, provenance by
one transpose of the piece references). The in-process train loader takes each batch's packs in
one call (:meth:`PackStream.take`). The state after every pack records the source's
position right after the last packed document of the block, so documents read ahead and not
packed yet are read again on resume. Other children are read one document at a time, with the
same packs as the result. :meth:`IterablePackedDataset.snapshot`
records a position in microseconds and builds its state only when asked; the train loader takes
one after every batch.

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
import itertools
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np

from lightning_tune_data.distributed import current_shard
from lightning_tune_data.keys import DROPPED_BEFORE, EPOCH, INPUT_IDS, LOSS_MASK, SOURCE, SOURCE_ROW, TRUNCATED_TOKENS
from lightning_tune_data.sources.base import TuneIterableDataset
from lightning_tune_data.packing.pieces import (
    IGNORE_INDEX,
    INLINE,
    NOT_REREADABLE,
    PACK_PIECES,
    ROW_AT,
    SOURCES,
    Pack,
    PackedSample,
    PieceExtra,
    Reference,
    concat_piece_states,
    document_labels,
    reference,
    references_to_state,
    take_pieces,
)
from lightning_tune_data.packing.placement import DocumentQueue, PackPlacer

__all__ = ["IterablePackedDataset", "PACKING_STRATEGIES", "OVERLONG_POLICIES", "IGNORE_INDEX"]

PACKING_STRATEGIES = ("greedy", "best_fit", "concat")
OVERLONG_POLICIES = ("truncate", "drop")

_END = object()
#: Documents in a row that can't be packed (empty, or dropped as overlong) before the packer gives up
#: instead of reading an infinite stream forever.
_MAX_UNUSABLE_IN_A_ROW = 100_000
#: Documents read from the source at a time when it hands out blocks (held by reference until packed).
_BLOCK_DOCUMENTS = 2048

Piece = tuple[Reference, np.ndarray, "PieceExtra | None"]


class _BlockStart(NamedTuple):
    """The packer right after it queued a block: a later snapshot replays placement from here."""

    queue: DocumentQueue  # the block's documents
    packs: list[Pack]  # the open packs (oldest first), then the finished packs not handed out
    counts: list[int]  # how many pieces each of ``packs`` held then
    num_open: int
    packs_out: int  # packs handed out before the block


class IterablePackedDataset(TuneIterableDataset):
    """Pack the document samples of a stream into packed samples (see the module docstring).

    Args:
        dataset: the stream of document samples to pack.
        max_seq_len: the most tokens in one pack.
        strategy: ``"greedy"``, ``"best_fit"`` (default) or ``"concat"``.
        buffer_size: open packs kept by ``"best_fit"`` (ignored by the other strategies).
        overlong: what ``greedy``/``best_fit`` do with a document longer than ``max_seq_len``:
            ``"truncate"`` (keep its first ``max_seq_len`` tokens) or ``"drop"``.
        dataset_name: name of this stream; default ``packed_<child name>``.
    """

    def __init__(
        self,
        dataset: TuneIterableDataset,
        max_seq_len: int,
        strategy: str = "best_fit",
        buffer_size: int = 64,
        overlong: str = "truncate",
        dataset_name: str | None = None,
    ) -> None:
        if strategy not in PACKING_STRATEGIES:
            raise ValueError(f"Unknown packing strategy {strategy!r}; choose one of {list(PACKING_STRATEGIES)}.")
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
        self._buffer_size = buffer_size
        self._overlong = overlong
        self._child_exhausted = False
        self._finished = False
        self._remaining: dict[str, Any] | None = None  # set by load_global_state, taken on first use
        self._counters = {
            "packs": 0,
            "documents": 0,
            "tokens": 0,
            "overlong_truncated": 0,
            "overlong_dropped": 0,
            "empty_dropped": 0,
        }
        self._placer = PackPlacer(strategy, max_seq_len, buffer_size, overlong, self._counters)
        self._queue = DocumentQueue()  # documents read in a block, not packed yet (block reading only)
        self._block_start: _BlockStart | None = None

    @property
    def dataset_name(self) -> str:
        return self._dataset_name

    @property
    def dataset(self) -> TuneIterableDataset:
        """The child stream."""
        return self._child

    @property
    def max_seq_len(self) -> int:
        return self._max_seq_len

    @property
    def strategy(self) -> str:
        return self._strategy

    @property
    def counters(self) -> dict[str, int]:
        """Packs and tokens emitted, documents consumed, overlong/empty documents handled."""
        return dict(self._counters)

    # -- documents in ----------------------------------------------------------------------
    def _prepare(self, sample: dict[str, Any]) -> Piece | None:
        """One document sample as a piece (reference, token view, extra); ``None``: not packable."""
        if INPUT_IDS not in sample:
            raise KeyError(
                f"Packer '{self._dataset_name}': a sample of '{self._child.dataset_name}' has no "
                f"'{INPUT_IDS}' (keys: {sorted(sample)}); pack document samples, not packed ones."
            )
        ids = sample[INPUT_IDS]
        if type(ids) is not np.ndarray or ids.dtype.kind not in "iu":  # the cache's views pass as they are
            ids = np.asarray(ids, dtype=np.int64)
        source = sample.get(SOURCE)
        source = self._child.dataset_name if source is None else str(source)
        if ids.ndim != 1:
            raise ValueError(
                f"Packer '{self._dataset_name}': '{INPUT_IDS}' of a document from '{source}' has "
                f"shape {ids.shape}; documents must be 1-D token-id arrays."
            )
        mask = sample.get(LOSS_MASK)
        if mask is not None:
            mask = np.asarray(mask, dtype=bool)
            if mask.shape != ids.shape:
                raise ValueError(
                    f"Packer '{self._dataset_name}': '{LOSS_MASK}' of a document from '{source}' has "
                    f"shape {mask.shape} but '{INPUT_IDS}' has {ids.shape}; give one flag per token."
                )
        counters = self._counters
        counters["documents"] += 1
        truncated = int(sample.get(TRUNCATED_TOKENS, 0))
        n = len(ids)
        if n == 0:
            counters["empty_dropped"] += 1
            return None
        if n > self._max_seq_len and self._strategy != "concat":
            if self._overlong == "drop":
                counters["overlong_dropped"] += 1
                return None
            counters["overlong_truncated"] += 1
            truncated += n - self._max_seq_len
            ids = ids[: self._max_seq_len]
            mask = None if mask is None else mask[: self._max_seq_len]
        row = sample.get(SOURCE_ROW)
        labels = None if mask is None else document_labels(ids, mask)
        ref = reference(source, row, int(sample.get(EPOCH, 0)), len(ids), truncated, int(sample.get(DROPPED_BEFORE, 0)))
        if row is None:  # cannot be re-read: own the tokens (they travel in the state)
            ids = ids.copy()
            mask = None if mask is None else mask.copy()
            return ref, ids, None if mask is None else PieceExtra(labels, mask)
        # A re-readable document stays a zero-copy view; only a masked one needs explicit labels.
        return ref, ids, None if labels is None else PieceExtra(labels, None)

    def _reads_blocks(self) -> bool:
        """Whether the child hands out blocks of document references (a plain ``ArrowSource``)."""
        supported = getattr(self._child, "blocks_supported", None)
        return supported is not None and bool(supported())

    def _read_block(self) -> bool:
        """Queue the child's next block of documents; ``False`` when the child has ended."""
        block = self._child.read_block(_BLOCK_DOCUMENTS)
        if block is None:
            return False
        self._placer.stores.update(block.stores)
        self._queue = DocumentQueue(block.references(), block.tokens, block=block)
        self._block_start = _BlockStart(self._queue, *self._held_packs(), self._counters["packs"])
        return True

    # -- packs out -------------------------------------------------------------------------
    def __iter__(self) -> PackStream:
        """The packs, one at a time (``next``) or several at once (:meth:`PackStream.take`)."""
        return PackStream(self)

    def _start_round(self) -> tuple[bool, Iterator[dict[str, Any]] | None]:
        """Begin iterating: pack a resumed layout's held pieces, start a new round over a finished
        finite child; returns whether the child is read in blocks, and else its iterator."""
        self._resolve()
        if self._finished:  # new round over a finished finite child
            self._finished = False
            self._child_exhausted = False
        blocks = self._reads_blocks()
        return blocks, None if self._child_exhausted or blocks else iter(self._child)

    def _next_document(self, child_it: Iterator[dict[str, Any]] | None, unusable: int) -> int:
        """Place the child's next document (one read one at a time); returns the count of unusable
        documents in a row after it."""
        sample = next(child_it, _END)
        if sample is _END:
            self._child_exhausted = True
            self._placer.close_all()
            return unusable
        piece = self._prepare(sample)
        if piece is not None:
            self._placer.add(*piece)
            return 0
        unusable += 1
        if unusable >= _MAX_UNUSABLE_IN_A_ROW:
            raise RuntimeError(
                f"Packer '{self._dataset_name}': the last {unusable:,} documents of '{self._child.dataset_name}' "
                f"were all empty or dropped as longer than max_seq_len={self._max_seq_len} "
                f"({self._counters}); nothing can be packed. Check the data and the overlong policy."
            )
        return unusable

    # -- state -----------------------------------------------------------------------------
    def _piece_from_reference(self, state: dict[str, Any], index: int) -> Piece:
        source = state[SOURCES][state["source"][index]]
        row, epoch = int(state["row"][index]), int(state["epoch"][index])
        start, length = int(state["start"][index]), int(state["length"][index])
        inline = state[INLINE].get(str(index))
        if inline is not None:
            ids = np.asarray(inline[INPUT_IDS], dtype=np.int64)
            labels = np.asarray(inline["labels"], dtype=np.int64)
            mask = None if inline[LOSS_MASK] is None else np.asarray(inline[LOSS_MASK], dtype=bool)
            extra, row = PieceExtra(labels, mask), NOT_REREADABLE
        else:
            document = self._child.read_document(source, row, epoch)
            if document is None or len(document[INPUT_IDS]) < start + length:
                raise ValueError(
                    f"Packer '{self._dataset_name}': the saved state holds tokens {start}..{start + length} of row "
                    f"{row} of source '{source}' (pass {epoch}), which the source can no longer provide. The data "
                    "changed since the checkpoint; restore it, or resume with `resume_data_state: false`."
                )
            full_ids = np.asarray(document[INPUT_IDS])
            if full_ids.dtype.kind not in "iu":
                full_ids = full_ids.astype(np.int64)
            full_mask = document.get(LOSS_MASK)
            ids, extra = full_ids[start : start + length], None
            if full_mask is not None:
                labels = document_labels(full_ids, np.asarray(full_mask, dtype=bool))[start : start + length]
                labels[-1] = IGNORE_INDEX
                extra = PieceExtra(labels, None)
        ref = (source, row, epoch, start, length, bool(state["new_document"][index]),
               int(state["truncated_tokens"][index]), int(state["dropped_before"][index]))
        return ref, ids, extra

    def _packs_from_state(self, state: dict[str, Any]) -> list[Pack]:
        packs, index = [], 0
        for count in state[PACK_PIECES]:
            pack = Pack()
            for _ in range(int(count)):
                pack.add(*self._piece_from_reference(state, index))
                index += 1
            packs.append(pack)
        return packs

    def _set_counters(self, counters: dict[str, Any]) -> None:
        self._counters.clear()  # in place: the placer counts into the same dict
        self._counters.update({k: int(v) for k, v in counters.items()})

    def _resolve(self) -> None:
        """Pack this shard's share of the pieces held by an old layout (on first use)."""
        if self._remaining is None:
            return
        remaining, self._remaining = self._remaining, None
        shard = current_shard(getattr(self._child, "rank", 0), getattr(self._child, "world_size", 1))
        self._placer.set_open([])
        self._placer.ready.clear()
        self._queue, self._block_start = DocumentQueue(), None
        if shard.shard_id == 0:
            self._set_counters(remaining["counters"])
        for pack in self._packs_from_state(take_pieces(remaining["held"], shard.shard_id, shard.num_shards)):
            for piece in pack.pieces():
                self._placer.add(*piece)

    def state_dict(self) -> dict[str, Any]:
        # Built at once (a dataloader worker sends one after every batch): walking the held packs
        # costs less than replaying the block's placement, which only a snapshot that may never
        # be built should defer to.
        self._resolve()
        return self._held_snapshot()()

    def snapshot(self) -> Callable[[], dict[str, Any]]:
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
        start, queue = self._block_start, self._queue
        if start is not None and start.queue is queue and not self._child_exhausted:
            return self._replayed_snapshot(start, queue.at)
        return self._held_snapshot()

    def _held_packs(self) -> tuple[list[Pack], list[int], int]:
        """The open packs (oldest first) then the finished ones not handed out, each one's piece
        count now (packs only ever grow by appending), and how many are open."""
        packs = list(self._placer.open.values())
        num_open = len(packs)
        packs.extend(self._placer.ready)
        return packs, [len(pack.refs) for pack in packs], num_open

    def _fixed_state(self, num_open: int, counters: dict[str, int], child_exhausted: bool,
                     finished: bool) -> dict[str, Any]:
        return {
            "strategy": self._strategy,
            "max_seq_len": self._max_seq_len,
            "counters": counters,
            "num_open": num_open,
            "child_exhausted": child_exhausted,
            "finished": finished,
        }

    def _held_snapshot(self) -> Callable[[], dict[str, Any]]:
        """The snapshot that records every held pack and its current piece count."""
        packs, counts, num_open = self._held_packs()
        queue = self._queue
        block, placed = queue.block, queue.at
        fixed = self._fixed_state(num_open, dict(self._counters), self._child_exhausted, self._finished)
        pending = None
        if block is None:  # no block read yet, or documents restored from an older state: saved as documents
            fixed["child"] = self._child.state_dict()
            if len(queue):
                pending = (queue.refs, queue.tokens, queue.extras, placed)
        child, name = self._child, self._dataset_name

        def build() -> dict[str, Any]:
            state = {**fixed, "packs": _held_state(packs, counts)}
            if pending is not None:
                state["pending"] = _pending_state(*pending)
            if block is not None:  # the source's position after the last placed document of its block
                state["child"] = child.state_after_block(block, placed)
            return {name: state}

        return build

    def _replayed_snapshot(self, start: _BlockStart, placed: int) -> Callable[[], dict[str, Any]]:
        """The snapshot after ``placed`` documents of the block read at ``start``."""
        counters, finished = dict(self._counters), self._finished  # all that changes while a block is placed

        def build() -> dict[str, Any]:
            packs, num_open = self._replay(start, placed, counters["packs"] - start.packs_out)
            state = {**self._fixed_state(num_open, counters, False, finished),
                     "packs": _held_state(packs, [len(pack.refs) for pack in packs])}
            state["child"] = self._child.state_after_block(start.queue.block, placed)
            return {self._dataset_name: state}

        return build

    def _replay(self, start: _BlockStart, placed: int, handed_out: int) -> tuple[list[Pack], int]:
        """The held packs after placing the block's first ``placed`` documents from ``start`` and
        handing out ``handed_out`` packs since, and how many of them are open."""
        placer = PackPlacer(self._strategy, self._max_seq_len, self._buffer_size, self._overlong, dict(self._counters))
        placer.stores = self._placer.stores
        held = [pack.prefix(count) for pack, count in zip(start.packs, start.counts)]
        placer.set_open(held[: start.num_open])
        finished = held[start.num_open :]
        block = start.queue
        queue = DocumentQueue(block.refs[:placed], block.tokens[:placed],
                              None if block.extras is None else block.extras[:placed])
        while queue:
            placer.place_from(queue)
            finished.extend(placer.ready)
            placer.ready.clear()
        open_packs = list(placer.open.values())
        return open_packs + finished[handed_out:], len(open_packs)

    def _check_settings(self, own: dict[str, Any]) -> None:
        if own["strategy"] != self._strategy or own["max_seq_len"] != self._max_seq_len:
            raise ValueError(
                f"Packer '{self._dataset_name}': the saved state was written with strategy="
                f"{own['strategy']!r}, max_seq_len={own['max_seq_len']}, but this packer uses "
                f"strategy={self._strategy!r}, max_seq_len={self._max_seq_len}. Resume with the same "
                "packing settings, or start the data fresh (`resume_data_state: false`)."
            )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        own = self._own_state(state_dict)
        self._check_settings(own)
        self._child.load_state_dict(own["child"])
        self._remaining = None
        self._set_counters(own["counters"])
        packs = self._packs_from_state(own["packs"])
        self._placer.set_open(packs[: own["num_open"]])
        self._placer.ready.clear()
        self._placer.ready.extend(packs[own["num_open"] :])
        pending = [] if own.get("pending") is None else self._packs_from_state(own["pending"])
        pieces = [piece for pack in pending for piece in pack.pieces()]
        self._queue = DocumentQueue([p[0] for p in pieces], [p[1] for p in pieces], [p[2] for p in pieces])
        self._block_start = None
        self._child_exhausted = bool(own["child_exhausted"])
        self._finished = bool(own["finished"])

    def merge_shard_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        """Every old shard's held pieces (open and finished packs) and merged child states."""
        owns = [self._own_state(s) for s in states]
        for own in owns:
            self._check_settings(own)
        counters: dict[str, int] = collections.Counter()
        for own in owns:
            counters.update({k: int(v) for k, v in own["counters"].items()})
            if own.get("pending"):  # documents restored from an older state, not packed yet
                counters["documents"] += len(own["pending"]["row"])
        return {
            self._dataset_name: {
                "held": concat_piece_states([own["packs"] for own in owns]
                                            + [own["pending"] for own in owns if own.get("pending")]),
                "counters": dict(counters),
                "child": self._child.merge_shard_states([own["child"] for own in owns]),
            }
        }

    def load_global_state(self, global_state: dict[str, Any]) -> None:
        own = self._own_state(global_state)
        self._child.load_global_state(own["child"])
        self._remaining = own

    def read_document(self, source: str, row: int, epoch: int) -> dict[str, Any] | None:
        return self._child.read_document(source, row, epoch)


class PackStream:
    """The iterator over a packer's packs: ``next`` hands out one :class:`PackedSample`,
    :meth:`take` a batch's worth at once.

    Taking ``count`` packs places documents until ``count`` packs are finished and hands them out
    together: the same packs, in the same order, and the same state after them as ``count``
    calls of ``next``, without a step per pack in between. The in-process train loader takes
    every batch this way.

    Args:
        packer: the packer whose packs are handed out.
    """

    __slots__ = ("_packer", "_started", "_blocks", "_child_it", "_queue", "_place", "_unusable", "_ended")

    def __init__(self, packer: IterablePackedDataset) -> None:
        self._packer = packer
        self._started = False  # the round begins at the first pack asked for, as a generator's would
        self._blocks = False
        self._child_it: Iterator[dict[str, Any]] | None = None
        self._queue: DocumentQueue | None = None  # the queue ``_place`` was looked up for
        self._place: Callable[[DocumentQueue, int], int] | None = None
        self._unusable = 0  # documents in a row that could not be packed
        self._ended = False

    def __iter__(self) -> PackStream:
        return self

    def __next__(self) -> PackedSample:
        ready = self._filled(1)
        if not ready:
            raise StopIteration
        pack = ready.popleft()
        counters = self._packer._counters
        counters["packs"] += 1
        counters["tokens"] += pack.length
        return PackedSample(pack)

    def take(self, count: int) -> list[PackedSample]:
        """The next up to ``count`` packs; fewer only when a finite child has ended (then the
        round is over, and later calls return ``[]``)."""
        ready = self._filled(count)
        taken = min(count, len(ready))
        packs = [PackedSample(ready.popleft()) for _ in range(taken)]
        counters = self._packer._counters
        counters["packs"] += taken
        counters["tokens"] += sum(sample.pack.length for sample in packs)
        return packs

    def _filled(self, count: int) -> collections.deque[Pack]:
        """The finished packs after placing documents until there are ``count`` (or the child
        ended: then, with fewer, the round is over)."""
        if self._ended:
            return collections.deque()
        packer = self._packer
        if not self._started:
            self._started = True
            self._blocks, self._child_it = packer._start_round()
        placer = packer._placer
        ready = placer.ready
        if len(ready) >= count:
            return ready
        counters = packer._counters
        while len(ready) < count and not packer._child_exhausted:
            if not self._blocks:
                self._unusable = packer._next_document(self._child_it, self._unusable)
                continue
            queue = packer._queue
            if queue is not self._queue:  # a new block (or documents restored from a state)
                self._queue, self._place = queue, placer.placement_for(queue)
            if queue.at < len(queue.refs):  # place queued documents until the packs are ready; the state holds the rest
                counters["documents"] += self._place(queue, count)
            elif not packer._read_block():
                packer._child_exhausted = True
                placer.close_all()
        if len(ready) < count:  # the child ended: the round is over once these are out
            packer._finished = True
            self._ended = True
        return ready


def _held_state(packs: list[Pack], counts: list[int]) -> dict[str, Any]:
    """The state of ``packs`` as they were when each held ``counts[i]`` pieces."""
    held = list(zip(packs, counts))
    refs = [ref for pack, count in held for ref in pack.refs[:count]]
    inline = []
    if any(ref[ROW_AT] == NOT_REREADABLE for ref in refs):
        position = 0
        for pack, count in held:
            for ref, tokens, extra in itertools.islice(pack.pieces(), count):
                if ref[ROW_AT] == NOT_REREADABLE:
                    inline.append((position, tokens, extra))
                position += 1
    return references_to_state(refs, [count for _, count in held], inline)


def _pending_state(refs: list[Reference], tokens: list[np.ndarray], extras: list[PieceExtra | None] | None,
                   at: int) -> dict[str, Any]:
    """The state of the documents read in a block but not packed yet (from position ``at``)."""
    refs = refs[at:]
    inline = []
    if extras is not None:  # loaded from a state: may hold pieces that can't be re-read
        inline = [(i, piece_tokens, extra) for i, (ref, piece_tokens, extra) in
                  enumerate(zip(refs, tokens[at:], extras[at:])) if ref[ROW_AT] == NOT_REREADABLE]
    return references_to_state(refs, [len(refs)], inline)
