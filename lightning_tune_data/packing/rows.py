"""Rows of a batch from packs: each pack's tokens padded to one width, written in place.

When every piece is a position in flat token arrays of one integer dtype (documents read in
blocks), a batch's rows are one join of byte ranges of those arrays plus cached padding, converted
in one copy; otherwise the pieces' arrays and the padding are concatenated.
"""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from lightning_tune_data.packing.pieces import LENGTH_AT, SOURCE_AT, token_arrays

if TYPE_CHECKING:
    from lightning_tune_data.packing.pack import Pack

__all__ = ["integer_bounds", "write_rows"]

_REFS, _TOKENS = operator.attrgetter("refs"), operator.attrgetter("tokens")


@functools.cache
def integer_bounds(dtype: np.dtype) -> tuple[int, int]:
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
    low, high = integer_bounds(dtype)
    if not low <= pad_id <= high:
        return None
    positions = itertools.chain.from_iterable(map(_TOKENS, packs))
    try:  # a piece that holds its own array can't be a slice bound (TypeError), nor its source be a store's (KeyError)
        if len(views) == 1:
            view = next(iter(views.values()))
            sliced = getattr(view, "slices", None)  # a store read shard by shard slices a batch at once
            parts = (sliced(positions, lengths) if sliced is not None else
                     [view[position : position + length] for position, length in zip(positions, lengths)])
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
    return np.frombuffer(bytearray().join(parts), dtype=dtype)  # writable: a caller may keep it as its batch


def write_rows(packs: Sequence[Pack], width: int, pad_id: int, out: np.ndarray | None,
               lengths: Sequence[int] | None = None, sources: Sequence[str] | None = None) -> np.ndarray | None:
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
        out: the flat output array; ``None``: the rows are only returned (joined, or concatenated
            into a new int64 array), for a caller that narrows them itself.
        lengths: every piece's length, packs back to back, when the caller has them already
            (default: read from the references).
        sources: every piece's source name, likewise.

    Returns:
        The joined rows in the flat arrays' dtype when they were joined (a writable array of its
        own: a caller that shifts them, for labels, reads these narrower values, and a compact
        batch carries them as they are), else ``None`` (with ``out=None``: the concatenated rows).
    """
    if lengths is None or sources is None:
        refs = list(itertools.chain.from_iterable(map(_REFS, packs)))
        lengths = [ref[LENGTH_AT] for ref in refs]
        sources = [ref[SOURCE_AT] for ref in refs]
    joined = _joined_rows(packs, width, pad_id, lengths, sources)
    if joined is not None:
        if out is not None:
            np.copyto(out, joined, casting="same_kind")
        return joined
    padding_tokens = np.full(width, pad_id, dtype=np.int64)
    arrays: list[np.ndarray] = []
    for pack in packs:
        arrays += token_arrays(pack.refs, pack.tokens, pack.stores)
        if pack.length < width:
            arrays.append(padding_tokens[: width - pack.length])
    if out is None:
        return np.concatenate(arrays, dtype=np.int64, casting="same_kind")
    np.concatenate(arrays, out=out, casting="same_kind")
    return None

