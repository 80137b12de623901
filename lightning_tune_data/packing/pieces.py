"""Pieces and packs of the packer, their bulk materialisation, and their by-reference state.

A *piece* is a document, or the part ``[start, start + length)`` of one, placed in a pack. The
packer keeps three things per piece, in parallel lists of its :class:`Pack`:

* its *reference*, a plain tuple ``(source, row, epoch, start, length, new_document,
  truncated_tokens, dropped_before)`` (:data:`PIECE_COLUMNS`): exactly one row of the saved state,
  so saving a pack is a transpose of its references (``row`` is ``-1`` for a document that cannot
  be re-read);
* its *tokens*: for a document read in a block of an ``ArrowSource``, the position (an ``int``)
  of its first token in that source's flat token array (``flat_tokens()``, found through the
  pack's ``stores`` by the reference's source name; :func:`token_arrays` turns positions into
  views); otherwise a zero-copy view;
* an optional :class:`PieceExtra`: explicit labels (a document with a loss mask) and, for a
  document that cannot be re-read, its loss mask (both travel in the state with its tokens).

No per-token work happens until a pack is materialised, and then it is a handful of vectorised
operations per pack or per batch. Labels: a piece without explicit labels is labelled by shifting
the pack's tokens by one and writing ``-100`` at the piece's last position (its next token is not
in this piece).
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from lightning_tune_data.keys import DROPPED_BEFORE, EPOCH, INPUT_IDS, LOSS_MASK, SOURCE, TRUNCATED_TOKENS

IGNORE_INDEX = -100

# Keys of the by-reference pack state (one list entry per piece, in pack order).
SOURCES = "sources"
PACK_PIECES = "pack_pieces"
PIECE_COLUMNS = ("source", "row", "epoch", "start", "length", "new_document", "truncated_tokens", "dropped_before")
INLINE = "inline"
#: ``row`` of a piece whose document cannot be re-read (its tokens travel in the state).
NOT_REREADABLE = -1
#: Positions of the fields in a piece reference.
SOURCE_AT, ROW_AT, EPOCH_AT, START_AT, LENGTH_AT, NEW_DOCUMENT_AT, TRUNCATED_AT, DROPPED_AT = range(8)

_REFS, _TOKENS = operator.attrgetter("refs"), operator.attrgetter("tokens")

Reference = tuple  # (source, row, epoch, start, length, new_document, truncated_tokens, dropped_before)
#: A piece's tokens: a position in its source's flat token array, or a view.
PieceTokens = np.ndarray | int


class PieceExtra(NamedTuple):
    """What a piece needs beyond its reference and tokens (most pieces need nothing)."""

    labels: np.ndarray | None  # explicit labels (a masked document); None: the plain shift
    loss_mask: np.ndarray | None  # kept for a document that cannot be re-read (saved with its tokens)


def reference(source: str, row: int | None, epoch: int, length: int, truncated_tokens: int = 0,
              dropped_before: int = 0) -> Reference:
    """The reference of a whole document (``row=None``: it cannot be re-read)."""
    return (source, NOT_REREADABLE if row is None else int(row), int(epoch), 0, int(length), True,
            int(truncated_tokens), int(dropped_before))


def split_piece(ref: Reference, tokens: PieceTokens, extra: PieceExtra | None, offset: int,
                length: int) -> tuple[Reference, PieceTokens, PieceExtra | None]:
    """The part ``[offset, offset + length)`` of a piece (its last label is ``-100``)."""
    first = offset == 0
    part = (ref[SOURCE_AT], ref[ROW_AT], ref[EPOCH_AT], ref[START_AT] + offset, length, ref[NEW_DOCUMENT_AT] and first,
            ref[TRUNCATED_AT] if first else 0, ref[DROPPED_AT] if first else 0)
    if extra is not None:
        labels, mask = extra
        if labels is not None:
            labels = labels[offset : offset + length].copy()
            labels[-1] = IGNORE_INDEX
        extra = PieceExtra(labels, None if mask is None else mask[offset : offset + length])
    return part, tokens + offset if type(tokens) is int else tokens[offset : offset + length], extra


def token_arrays(refs: list[Reference], tokens: list[PieceTokens], stores: Mapping[str, Any] | None) -> list[np.ndarray]:
    """Every piece's tokens as an array: a position is a view into its source's flat token array."""
    arrays, flats = [], {}
    for ref, entry in zip(refs, tokens):
        if type(entry) is int:
            flat = flats.get(ref[SOURCE_AT])
            if flat is None:
                flat = flats[ref[SOURCE_AT]] = stores[ref[SOURCE_AT]].flat_tokens()
            entry = flat[entry : entry + ref[LENGTH_AT]]
        arrays.append(entry)
    return arrays


@functools.cache
def _integer_bounds(dtype: np.dtype) -> tuple[int, int]:
    """The least and greatest value of an integer dtype (``np.iinfo`` costs microseconds per call)."""
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


@functools.lru_cache(maxsize=8)
def _padding_view(width: int, pad_id: int, dtype: np.dtype) -> memoryview:
    """``width`` tokens of ``pad_id`` in ``dtype`` (the same few rows for every batch)."""
    padding = np.full(width, pad_id, dtype=dtype)
    padding.flags.writeable = False
    return memoryview(padding)


def _flat_views(packs: Sequence[Pack]) -> tuple[dict[str, memoryview], np.dtype] | None:
    """By source name, views of the flat token arrays the packs' positions index, and their one
    dtype; ``None`` when there are none or their dtypes differ."""
    first = packs[0].stores
    if all(pack.stores is first for pack in packs):  # the packs of one packer share its stores
        all_stores = [first] if first else []
    else:
        all_stores = {id(pack.stores): pack.stores for pack in packs if pack.stores}.values()
    views: dict[str, memoryview] = {}
    dtype = None
    for stores in all_stores:
        for name, store in stores.items():
            view, flat_dtype = store.flat_view()
            if dtype is not None and flat_dtype != dtype:
                return None
            dtype = flat_dtype
            views[name] = view
    return None if dtype is None else (views, dtype)


def _joined_rows(packs: Sequence[Pack], width: int, pad_id: int, lengths: Sequence[int],
                 sources: Sequence[str]) -> np.ndarray | None:
    """Every pack's tokens, each row padded with ``pad_id`` to ``width``, as one join of ranges
    of the flat token arrays (in their dtype); ``None`` unless every piece is a position in flat
    token arrays of one integer dtype that holds ``pad_id``."""
    found = _flat_views(packs)
    if found is None:
        return None
    views, dtype = found
    low, high = _integer_bounds(dtype)
    if not low <= pad_id <= high:
        return None
    positions = itertools.chain.from_iterable(map(_TOKENS, packs))
    try:  # a piece that holds its own array can't be a slice bound (TypeError), nor its source be a store's (KeyError)
        if len(views) == 1:
            view = next(iter(views.values()))
            parts = [view[position : position + length] for position, length in zip(positions, lengths)]
        else:
            parts = [views[source][position : position + length]
                     for source, position, length in zip(sources, positions, lengths)]
    except (TypeError, KeyError):
        return None
    padding = _padding_view(width, pad_id, dtype)
    end = len(parts)
    for pack in reversed(packs):  # each row's padding after its last piece
        if pack.length < width:
            parts.insert(end, padding[: width - pack.length])
        end -= len(pack.tokens)
    return np.frombuffer(b"".join(parts), dtype=dtype)


def write_rows(packs: Sequence[Pack], width: int, pad_id: int, out: np.ndarray,
               lengths: Sequence[int] | None = None, sources: Sequence[str] | None = None) -> None:
    """Write every pack's tokens, each row padded with ``pad_id`` to ``width`` tokens, into the
    flat array ``out`` (``len(packs) * width`` items).

    When every piece is a position in flat token arrays of one integer dtype that holds
    ``pad_id`` (documents read in blocks), the rows are one join of ranges of those arrays,
    converted in one copy: slicing a buffer costs a fraction of building a NumPy view per piece.
    Otherwise the pieces' arrays and the padding are concatenated.

    Args:
        packs: the rows' packs, in order.
        width: tokens per row.
        pad_id: the token written after each pack's pieces.
        out: the flat output array.
        lengths, sources: every piece's length and source name, packs back to back, when the
            caller has them already (default: read from the references).
    """
    if lengths is None or sources is None:
        refs = list(itertools.chain.from_iterable(map(_REFS, packs)))
        lengths = [ref[LENGTH_AT] for ref in refs]
        sources = [ref[SOURCE_AT] for ref in refs]
    joined = _joined_rows(packs, width, pad_id, lengths, sources)
    if joined is not None:
        np.copyto(out, joined, casting="same_kind")
        return
    padding_tokens = np.full(width, pad_id, dtype=np.int64)
    arrays: list[np.ndarray] = []
    for pack in packs:
        arrays += token_arrays(pack.refs, pack.tokens, pack.stores)
        if pack.length < width:
            arrays.append(padding_tokens[: width - pack.length])
    np.concatenate(arrays, out=out, casting="same_kind")


def piece_labels(tokens: np.ndarray, extra: PieceExtra | None) -> np.ndarray:
    """A piece's labels as an array (the shift within the piece when it has no explicit labels)."""
    if extra is not None and extra.labels is not None:
        return extra.labels
    labels = np.full(len(tokens), IGNORE_INDEX, dtype=np.int64)
    labels[:-1] = tokens[1:]
    return labels


def provenance_entry(ref: Reference) -> dict[str, Any]:
    """The per-document provenance of one piece (what a packed sample's ``provenance`` lists)."""
    return {
        SOURCE: ref[SOURCE_AT],
        EPOCH: ref[EPOCH_AT],
        "tokens": ref[LENGTH_AT],
        "new_document": ref[NEW_DOCUMENT_AT],
        TRUNCATED_TOKENS: ref[TRUNCATED_AT],
        DROPPED_BEFORE: ref[DROPPED_AT],
    }


class Pack:
    """The pieces of one pack, in order (references, tokens, extras), and their total length.

    Args:
        stores: by source name, the sources whose flat token arrays the pieces' positions index
            (the placer's, shared by all its packs).
        refs, tokens: the first pieces' references and tokens (default: none).
        length: the sum of those pieces' lengths.
    """

    __slots__ = ("refs", "tokens", "extras", "length", "stores")

    def __init__(self, stores: Mapping[str, Any] | None = None, refs: list[Reference] | None = None,
                 tokens: list[PieceTokens] | None = None, length: int = 0) -> None:
        self.refs: list[Reference] = [] if refs is None else refs
        self.tokens: list[PieceTokens] = [] if tokens is None else tokens
        # The extras of the first len(extras) pieces (the later ones have none); None while no piece has one.
        self.extras: list[PieceExtra | None] | None = None
        self.length = length  # the sum of the pieces' lengths
        self.stores = stores

    def add(self, ref: Reference, tokens: PieceTokens, extra: PieceExtra | None = None) -> None:
        if extra is not None:
            if self.extras is None:
                self.extras = []
            self.extras += [None] * (len(self.refs) - len(self.extras))
            self.extras.append(extra)
        self.refs.append(ref)
        self.tokens.append(tokens)
        self.length += ref[LENGTH_AT]

    def prefix(self, count: int) -> Pack:
        """A new pack of this pack's first ``count`` pieces (the pack as it was when it held them)."""
        refs = self.refs[:count]
        pack = Pack(self.stores, refs, self.tokens[:count], sum(ref[LENGTH_AT] for ref in refs))
        pack.extras = None if self.extras is None else self.extras[:count]
        return pack

    def pieces(self) -> Iterator[tuple[Reference, PieceTokens, PieceExtra | None]]:
        extras = self.extras or []
        extras = extras + [None] * (len(self.refs) - len(extras))
        return zip(self.refs, self.tokens, extras)

    def to_sample(self) -> dict[str, Any]:
        """The packed sample: every per-token array built with a few vectorised operations."""
        lens = [ref[LENGTH_AT] for ref in self.refs]
        n = self.length
        input_ids = np.empty(n, dtype=np.int64)
        write_rows([self], n, 0, input_ids, lens, [ref[SOURCE_AT] for ref in self.refs])  # one full row: no padding
        ends = np.cumsum(lens)
        labels = np.empty(n, dtype=np.int64)
        labels[:-1] = input_ids[1:]
        labels[ends - 1] = IGNORE_INDEX
        if self.extras is not None:
            for extra, end, length in zip(self.extras, ends.tolist(), lens):
                if extra is not None and extra.labels is not None:
                    labels[end - length : end] = extra.labels
        lens_array = np.asarray(lens, dtype=np.int64)
        return {
            INPUT_IDS: input_ids,
            "labels": labels,
            "position_ids": np.arange(n, dtype=np.int64) - np.repeat(ends - lens_array, lens_array),
            "document_ids": np.repeat(np.arange(len(lens), dtype=np.int64), lens_array),
            "seq_lens": lens,
            "provenance": [provenance_entry(ref) for ref in self.refs],
        }


class PackedSample(Mapping):
    """A packed sample that builds its arrays on first access.

    It reads like the dict :meth:`Pack.to_sample` returns (``input_ids``, ``labels``,
    ``position_ids``, ``document_ids``, ``seq_lens``, ``provenance``); ``PackedCollator`` reads its
    ``pack`` instead and builds a whole batch with a few vectorised operations.
    """

    __slots__ = ("pack", "_sample")
    KEYS = (INPUT_IDS, "labels", "position_ids", "document_ids", "seq_lens", "provenance")

    def __init__(self, pack: Pack | Mapping[str, Any]) -> None:
        if isinstance(pack, Pack):
            self.pack: Pack | None = pack
            self._sample: dict[str, Any] | None = None
        else:  # rebuilt from its items (``torch.utils.data.default_convert`` does that)
            self.pack, self._sample = None, dict(pack)

    def _materialised(self) -> dict[str, Any]:
        if self._sample is None:
            self._sample = self.pack.to_sample()
        return self._sample

    def __getitem__(self, key: str) -> Any:
        return self._materialised()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.KEYS)

    def __len__(self) -> int:
        return len(self.KEYS)

    def __reduce__(self) -> tuple:  # crosses process boundaries as the plain dict
        return (dict, (self._materialised(),))

    def __repr__(self) -> str:
        return f"PackedSample({len(self[INPUT_IDS])} tokens, {len(self['seq_lens'])} documents)"


def references_to_state(refs: list[Reference], pack_pieces: list[int],
                        inline_pieces: Iterable[tuple[int, np.ndarray, PieceExtra | None]] = ()) -> dict[str, Any]:
    """Piece references as the state's columns: one transpose, plain Python values only.

    Args:
        refs: every piece's reference, packs back to back.
        pack_pieces: how many pieces each pack has.
        inline_pieces: ``(position, tokens, extra)`` of the pieces that cannot be re-read.
    """
    columns = [list(column) for column in zip(*refs)] if refs else [[] for _ in PIECE_COLUMNS]
    sources = sorted(set(columns[SOURCE_AT]))
    if len(sources) == 1:
        columns[SOURCE_AT] = [0] * len(refs)
    else:
        index = {name: i for i, name in enumerate(sources)}
        columns[SOURCE_AT] = [index[name] for name in columns[SOURCE_AT]]
    inline = {}
    for position, tokens, extra in inline_pieces:
        inline[str(position)] = {
            INPUT_IDS: np.asarray(tokens).tolist(),
            LOSS_MASK: None if extra is None or extra.loss_mask is None else extra.loss_mask.tolist(),
            "labels": piece_labels(tokens, extra).tolist(),
        }
    state: dict[str, Any] = {SOURCES: sources, PACK_PIECES: list(pack_pieces)}
    state.update(zip(PIECE_COLUMNS, columns))
    state[INLINE] = inline
    return state


def concat_piece_states(states: list[dict[str, Any]]) -> dict[str, Any]:
    """The pieces of several states (shards) as one state with one pack per piece, in order."""
    sources = sorted({name for state in states for name in state[SOURCES]})
    index = {name: i for i, name in enumerate(sources)}
    merged: dict[str, Any] = {SOURCES: sources, PACK_PIECES: [], INLINE: {}, **{c: [] for c in PIECE_COLUMNS}}
    for state in states:
        offset = len(merged["row"])
        count = len(state["row"])
        for column in PIECE_COLUMNS:
            values = state[column]
            if column == "source":
                merged[column].extend(index[state[SOURCES][v]] for v in values)
            else:
                merged[column].extend(values)
        for key, value in state[INLINE].items():
            merged[INLINE][str(offset + int(key))] = value
        merged[PACK_PIECES].extend([1] * count)
    return merged


def take_pieces(state: dict[str, Any], shard_id: int, num_shards: int) -> dict[str, Any]:
    """Pieces ``shard_id::num_shards`` of a merged piece state (one pack per piece)."""
    chosen = list(range(len(state["row"])))[shard_id::num_shards]
    taken: dict[str, Any] = {SOURCES: state[SOURCES], PACK_PIECES: [1] * len(chosen), INLINE: {}}
    for column in PIECE_COLUMNS:
        taken[column] = [state[column][i] for i in chosen]
    for new, old in enumerate(chosen):
        if str(old) in state[INLINE]:
            taken[INLINE][str(new)] = state[INLINE][str(old)]
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
