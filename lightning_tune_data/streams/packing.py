"""``IterablePackedDataset``: pack document samples into sequences of at most ``max_seq_len`` tokens.

A *packed sample* is a dict of 1-D ``np.int64`` arrays of one common length ``n <= max_seq_len``
(not padded: the collator pads) plus two lists:

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
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lightning_tune_data.distributed import current_shard
from lightning_tune_data.streams.base import (
    DROPPED_BEFORE,
    EPOCH,
    INPUT_IDS,
    LOSS_MASK,
    SOURCE,
    SOURCE_ROW,
    TRUNCATED_TOKENS,
    TuneIterableDataset,
)

__all__ = ["IterablePackedDataset", "PACKING_STRATEGIES", "OVERLONG_POLICIES", "IGNORE_INDEX"]

PACKING_STRATEGIES = ("greedy", "best_fit", "concat")
OVERLONG_POLICIES = ("truncate", "drop")
IGNORE_INDEX = -100

_END = object()
#: Documents in a row that can't be packed (empty, or dropped as overlong) before the packer gives up
#: instead of reading an infinite stream forever.
_MAX_UNUSABLE_IN_A_ROW = 100_000


@dataclass
class _Piece:
    """A document, or the part ``[start, start + len)`` of one, placed in a pack.

    ``row is None`` means the document cannot be re-read from its source: its tokens travel in
    the state instead (``loss_mask`` is kept for that).
    """

    input_ids: np.ndarray
    labels: np.ndarray
    source: str
    epoch: int
    row: int | None
    start: int = 0
    new_document: bool = True
    truncated_tokens: int = 0
    dropped_before: int = 0
    loss_mask: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.input_ids)

    def part(self, offset: int, length: int) -> _Piece:
        """The sub-piece ``[offset, offset + length)`` of this piece, its last label masked."""
        labels = self.labels[offset : offset + length].copy()
        labels[-1] = IGNORE_INDEX
        mask = None if self.loss_mask is None else self.loss_mask[offset : offset + length]
        first = offset == 0
        return _Piece(self.input_ids[offset : offset + length], labels, self.source, self.epoch, self.row,
                      self.start + offset, self.new_document and first, self.truncated_tokens if first else 0,
                      self.dropped_before if first else 0, mask)

    def provenance(self) -> dict[str, Any]:
        return {
            SOURCE: self.source,
            EPOCH: self.epoch,
            "tokens": len(self),
            "new_document": self.new_document,
            TRUNCATED_TOKENS: self.truncated_tokens,
            DROPPED_BEFORE: self.dropped_before,
        }


@dataclass
class _Pack:
    pieces: list[_Piece] = field(default_factory=list)
    length: int = 0

    def add(self, piece: _Piece) -> None:
        self.pieces.append(piece)
        self.length += len(piece)

    def to_sample(self) -> dict[str, Any]:
        lens = [len(p) for p in self.pieces]
        return {
            INPUT_IDS: np.concatenate([p.input_ids for p in self.pieces]),
            "labels": np.concatenate([p.labels for p in self.pieces]),
            "position_ids": np.concatenate([np.arange(n, dtype=np.int64) for n in lens]),
            "document_ids": np.repeat(np.arange(len(lens), dtype=np.int64), lens),
            "seq_lens": lens,
            "provenance": [p.provenance() for p in self.pieces],
        }


# Keys of the by-reference pack state (one list entry per piece, in pack order).
_SOURCES = "sources"
_PACK_PIECES = "pack_pieces"
_PIECE_COLUMNS = ("source", "row", "epoch", "start", "length", "new_document", "truncated_tokens", "dropped_before")
_INLINE = "inline"


def _pieces_to_state(packs: list[_Pack]) -> dict[str, Any]:
    """Packs as plain lists of piece references (see the module docstring)."""
    pieces = [piece for pack in packs for piece in pack.pieces]
    sources = sorted({p.source for p in pieces})
    index = {name: i for i, name in enumerate(sources)}
    inline = {}
    for position, piece in enumerate(pieces):
        if piece.row is None:
            inline[str(position)] = {
                INPUT_IDS: piece.input_ids.tolist(),
                LOSS_MASK: None if piece.loss_mask is None else piece.loss_mask.tolist(),
                "labels": piece.labels.tolist(),
            }
    return {
        _SOURCES: sources,
        _PACK_PIECES: [len(pack.pieces) for pack in packs],
        "source": [index[p.source] for p in pieces],
        "row": [-1 if p.row is None else int(p.row) for p in pieces],
        "epoch": [int(p.epoch) for p in pieces],
        "start": [int(p.start) for p in pieces],
        "length": [len(p) for p in pieces],
        "new_document": [bool(p.new_document) for p in pieces],
        "truncated_tokens": [int(p.truncated_tokens) for p in pieces],
        "dropped_before": [int(p.dropped_before) for p in pieces],
        _INLINE: inline,
    }


def _concat_piece_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """The pieces of several states (shards) as one state with one pack per piece, in order."""
    sources = sorted({name for state in states for name in state[_SOURCES]})
    index = {name: i for i, name in enumerate(sources)}
    merged: dict[str, Any] = {_SOURCES: sources, _PACK_PIECES: [], _INLINE: {}, **{c: [] for c in _PIECE_COLUMNS}}
    for state in states:
        offset = len(merged["row"])
        count = len(state["row"])
        for column in _PIECE_COLUMNS:
            values = state[column]
            merged[column].extend(index[state[_SOURCES][v]] for v in values) if column == "source" else merged[column].extend(values)
        for key, value in state[_INLINE].items():
            merged[_INLINE][str(offset + int(key))] = value
        merged[_PACK_PIECES].extend([1] * count)
    return merged


def _take_pieces(state: dict[str, Any], shard_id: int, num_shards: int) -> dict[str, Any]:
    """Pieces ``shard_id::num_shards`` of a merged piece state (one pack per piece)."""
    chosen = list(range(len(state["row"])))[shard_id::num_shards]
    taken: dict[str, Any] = {_SOURCES: state[_SOURCES], _PACK_PIECES: [1] * len(chosen), _INLINE: {}}
    for column in _PIECE_COLUMNS:
        taken[column] = [state[column][i] for i in chosen]
    for new, old in enumerate(chosen):
        if str(old) in state[_INLINE]:
            taken[_INLINE][str(new)] = state[_INLINE][str(old)]
    return taken


def document_labels(input_ids: np.ndarray, loss_mask: np.ndarray | None) -> np.ndarray:
    """Shifted labels of one document: next token where it is a target, ``-100`` elsewhere and at the end.

    Args:
        input_ids: 1-D token ids of the document.
        loss_mask: 1-D bools, ``True`` where the token is a training target; ``None`` = all.
    """
    labels = np.full(len(input_ids), IGNORE_INDEX, dtype=np.int64)
    if len(input_ids) > 1:
        nxt = input_ids[1:]
        labels[:-1] = nxt if loss_mask is None else np.where(loss_mask[1:], nxt, IGNORE_INDEX)
    return labels


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
        self._open: list[_Pack] = []
        self._ready: collections.deque[_Pack] = collections.deque()
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
    def _prepare(self, sample: dict[str, Any]) -> _Piece | None:
        if INPUT_IDS not in sample:
            raise KeyError(
                f"Packer '{self._dataset_name}': a sample of '{self._child.dataset_name}' has no "
                f"'{INPUT_IDS}' (keys: {sorted(sample)}); pack document samples, not packed ones."
            )
        ids = np.asarray(sample[INPUT_IDS], dtype=np.int64)
        source = str(sample.get(SOURCE, self._child.dataset_name))
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
        self._counters["documents"] += 1
        truncated = int(sample.get(TRUNCATED_TOKENS, 0))
        if len(ids) == 0:
            self._counters["empty_dropped"] += 1
            return None
        if self._strategy != "concat" and len(ids) > self._max_seq_len:
            if self._overlong == "drop":
                self._counters["overlong_dropped"] += 1
                return None
            self._counters["overlong_truncated"] += 1
            truncated += len(ids) - self._max_seq_len
            ids = ids[: self._max_seq_len]
            mask = None if mask is None else mask[: self._max_seq_len]
        row = sample.get(SOURCE_ROW)
        return _Piece(ids.copy(), document_labels(ids, mask), source, int(sample.get(EPOCH, 0)),
                      None if row is None else int(row), 0, True, truncated, int(sample.get(DROPPED_BEFORE, 0)),
                      None if row is not None or mask is None else mask.copy())

    def _add(self, piece: _Piece) -> None:
        cap = self._max_seq_len
        if self._strategy == "concat":
            offset, n = 0, len(piece)
            if not self._open:
                self._open.append(_Pack())
            while offset < n:
                pack = self._open[0]
                take = min(cap - pack.length, n - offset)
                pack.add(piece.part(offset, take))
                offset += take
                if pack.length == cap:
                    self._ready.append(pack)
                    self._open[0] = _Pack()
            if self._open[0].length == 0:
                self._open.clear()
            return
        if self._strategy == "greedy":
            if self._open and self._open[0].length + len(piece) > cap:
                self._ready.append(self._open.pop())
            if not self._open:
                self._open.append(_Pack())
            self._open[0].add(piece)
            if self._open[0].length == cap:
                self._ready.append(self._open.pop())
            return
        # best_fit
        n, best, best_free = len(piece), -1, cap + 1
        for i, pack in enumerate(self._open):
            free = cap - pack.length
            if n <= free < best_free:
                best, best_free = i, free
        if best >= 0:
            pack = self._open[best]
            pack.add(piece)
            if pack.length == cap:
                self._ready.append(self._open.pop(best))
            return
        pack = _Pack()
        pack.add(piece)
        if pack.length == cap:
            self._ready.append(pack)
            return
        self._open.append(pack)
        if len(self._open) > self._buffer_size:
            fullest = max(range(len(self._open)), key=lambda i: (self._open[i].length, -i))
            self._ready.append(self._open.pop(fullest))

    # -- packs out -------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._resolve()
        if self._finished:  # new round over a finished finite child
            self._finished = False
            self._child_exhausted = False
        child_it = None if self._child_exhausted else iter(self._child)
        unusable = 0
        while True:
            if self._ready:
                pack = self._ready.popleft()
                self._counters["packs"] += 1
                self._counters["tokens"] += pack.length
                yield pack.to_sample()
                continue
            if self._child_exhausted:
                self._finished = True
                return
            sample = next(child_it, _END)
            if sample is _END:
                self._child_exhausted = True
                self._ready.extend(p for p in self._open if p.length)
                self._open.clear()
                continue
            piece = self._prepare(sample)
            if piece is not None:
                self._add(piece)
                unusable = 0
                continue
            unusable += 1
            if unusable >= _MAX_UNUSABLE_IN_A_ROW:
                raise RuntimeError(
                    f"Packer '{self._dataset_name}': the last {unusable:,} documents of '{self._child.dataset_name}' "
                    f"were all empty or dropped as longer than max_seq_len={self._max_seq_len} "
                    f"({self._counters}); nothing can be packed. Check the data and the overlong policy."
                )

    # -- state -----------------------------------------------------------------------------
    def _piece_from_reference(self, state: dict[str, Any], index: int) -> _Piece:
        source = state[_SOURCES][state["source"][index]]
        row, epoch = int(state["row"][index]), int(state["epoch"][index])
        start, length = int(state["start"][index]), int(state["length"][index])
        inline = state[_INLINE].get(str(index))
        if inline is not None:
            ids = np.asarray(inline[INPUT_IDS], dtype=np.int64)
            labels = np.asarray(inline["labels"], dtype=np.int64)
            mask = None if inline[LOSS_MASK] is None else np.asarray(inline[LOSS_MASK], dtype=bool)
            reference = None
        else:
            document = self._child.read_document(source, row, epoch)
            if document is None or len(document[INPUT_IDS]) < start + length:
                raise ValueError(
                    f"Packer '{self._dataset_name}': the saved state holds tokens {start}..{start + length} of row "
                    f"{row} of source '{source}' (pass {epoch}), which the source can no longer provide. The data "
                    "changed since the checkpoint; restore it, or resume with `resume_data_state: false`."
                )
            full_ids = np.asarray(document[INPUT_IDS], dtype=np.int64)
            full_mask = document.get(LOSS_MASK)
            full_mask = None if full_mask is None else np.asarray(full_mask, dtype=bool)
            ids = full_ids[start : start + length].copy()
            labels = document_labels(full_ids, full_mask)[start : start + length]
            labels[-1] = IGNORE_INDEX
            mask, reference = None, row
        return _Piece(ids, labels, source, epoch, reference, start, bool(state["new_document"][index]),
                      int(state["truncated_tokens"][index]), int(state["dropped_before"][index]), mask)

    def _packs_from_state(self, state: dict[str, Any]) -> list[_Pack]:
        packs, index = [], 0
        for count in state[_PACK_PIECES]:
            pack = _Pack()
            for _ in range(int(count)):
                pack.add(self._piece_from_reference(state, index))
                index += 1
            packs.append(pack)
        return packs

    def _resolve(self) -> None:
        """Pack this shard's share of the pieces held by an old layout (on first use)."""
        if self._remaining is None:
            return
        remaining, self._remaining = self._remaining, None
        shard = current_shard(getattr(self._child, "rank", 0), getattr(self._child, "world_size", 1))
        self._open, self._ready = [], collections.deque()
        if shard.shard_id == 0:
            self._counters = {k: int(v) for k, v in remaining["counters"].items()}
        for pack in self._packs_from_state(_take_pieces(remaining["held"], shard.shard_id, shard.num_shards)):
            self._add(pack.pieces[0])

    def state_dict(self) -> dict[str, Any]:
        self._resolve()
        return {
            self._dataset_name: {
                "strategy": self._strategy,
                "max_seq_len": self._max_seq_len,
                "counters": dict(self._counters),
                "num_open": len(self._open),
                "packs": _pieces_to_state(self._open + list(self._ready)),
                "child_exhausted": self._child_exhausted,
                "finished": self._finished,
                "child": self._child.state_dict(),
            }
        }

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
        self._counters = {k: int(v) for k, v in own["counters"].items()}
        packs = self._packs_from_state(own["packs"])
        self._open = packs[: own["num_open"]]
        self._ready = collections.deque(packs[own["num_open"] :])
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
        return {
            self._dataset_name: {
                "held": _concat_piece_states([own["packs"] for own in owns]),
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
