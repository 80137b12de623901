"""Zero-copy NumPy readers of the list columns of a cached Arrow table.

A cached source's ``input_ids`` (and ``loss_mask``) are Arrow ``list<...>`` columns, usually in
many record batches (chunks); a tokenized corpus whose documents lie apart in a file (items after
per-item size headers) has ``large_list_view`` chunks, each row a position and a length. :class:`ListColumn` reads rows of one such column as zero-copy NumPy
views, one chunk lookup per row; :class:`FlatColumn` sees every chunk's values and offsets as one
flat array each, so a row is a position and a length in one array (no Python object per row).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = ["FlatColumn", "ListColumn", "arrow_table", "is_list_type", "is_view_type"]

#: Chunks up to which reading rows builds the flat token view first (~3 us per chunk, once per
#: process: 30 ms at this count). Beyond it rows are looked up chunk by chunk, unless the packer
#: already built the view, so a cache of many small record batches starts reading at once.
_FLAT_ROWS_MAX_CHUNKS = 10_000


def is_view_type(kind: pa.DataType) -> bool:
    """Whether ``kind`` is a list view (rows given by an offset and a size each, apart in the values).

    Args:
        kind: an Arrow type.
    """
    return pa.types.is_list_view(kind) or pa.types.is_large_list_view(kind)


def is_list_type(kind: pa.DataType) -> bool:
    """Whether ``kind`` holds a list per row: ``list``, ``large_list`` or a list view.

    Args:
        kind: an Arrow type.
    """
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or is_view_type(kind)


def arrow_table(dataset: Any) -> pa.Table:
    """The Arrow table behind a ``datasets.Dataset`` (or a table itself), indices flattened."""
    if isinstance(dataset, pa.Table):
        return dataset
    if getattr(dataset, "_indices", None) is not None:
        dataset = dataset.flatten_indices()
    return dataset.data.table


class ListColumn:
    """Zero-copy NumPy access to one ``list<...>`` column of an Arrow table.

    Start-up reads only the chunk lengths (one int64 per chunk is kept); a chunk's offsets and
    values are turned into NumPy views the first time a row in it is read (the most recent
    ``_CACHED_CHUNKS`` are kept).

    Args:
        column: the Arrow column (a ``list<...>`` column of the source's table).
        name: the column's name (for error messages).
        source: the source's name (for error messages).
    """

    _CACHED_CHUNKS = 1024

    def __init__(self, column: pa.ChunkedArray, name: str, source: str) -> None:
        self._column = column  # chunks are wrapped on first use: no Python object per chunk is kept
        self._name = name
        self._source = source
        count = column.num_chunks
        lengths = np.fromiter((len(chunk) for chunk in column.iterchunks()), dtype=np.int64, count=count)
        self._starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # 8 bytes per chunk
        self._single = count == 1
        self._views: OrderedDict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = OrderedDict()
        self._flat: FlatColumn | None | bool = False  # False: not built yet

    def __len__(self) -> int:
        """Number of rows of the column."""
        return int(self._starts[-1])

    def _view(self, chunk_index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each row's first and end positions, and the values, of chunk ``chunk_index`` as NumPy
        arrays (kept for the next rows)."""
        view = self._views.get(chunk_index)
        if view is not None:
            return view
        chunk = self._column.chunk(chunk_index)
        if not (is_list_type(chunk.type)):
            raise TypeError(
                f"Source '{self._source}': column '{self._name}' has type {chunk.type}, expected a list of "
                "integers. Re-run prepare_data with a preprocess function that returns lists."
            )
        values = chunk.values
        if pa.types.is_boolean(values.type):
            array = values.to_numpy(zero_copy_only=False)
        else:
            array = values.to_numpy(zero_copy_only=values.null_count == 0)
        offsets = chunk.offsets.to_numpy()
        if is_view_type(chunk.type):  # rows apart in the values: each its offset and size
            view = (offsets, offsets + chunk.sizes.to_numpy(), array)
        else:
            view = (offsets[:-1], offsets[1:], array)
        self._views[chunk_index] = view
        if len(self._views) > self._CACHED_CHUNKS:
            self._views.popitem(last=False)
        return view

    def row(self, index: int) -> np.ndarray:
        """A zero-copy view of row ``index``."""
        if self._single:
            chunk, local = 0, index
        else:
            chunk = int(np.searchsorted(self._starts, index, side="right")) - 1
            local = index - int(self._starts[chunk])
        starts, ends, values = self._view(chunk)
        return values[starts[local] : ends[local]]

    def rows(self, indices: np.ndarray) -> list[np.ndarray]:
        """Zero-copy views of several rows (one vectorised chunk lookup for all of them).

        Args:
            indices: row indices (an integer array).
        """
        if self._single:
            starts, ends, values = self._view(0)
            return [values[b:e] for b, e in zip(starts[indices].tolist(), ends[indices].tolist())]
        flat = self._flat
        if flat is False:
            flat = self.flat() if self._column.num_chunks <= _FLAT_ROWS_MAX_CHUNKS else None
        if flat is not None:  # one slice of the flat values per row: a third of the per-chunk lookups' time
            starts, lengths = flat.positions(indices)
            values = flat.values
            return [values[start : start + length] for start, length in zip(starts.tolist(), lengths.tolist())]
        chunks = np.searchsorted(self._starts, indices, side="right") - 1
        local = (indices - self._starts[chunks]).tolist()
        cache, views = self._views, []
        for chunk, row in zip(chunks.tolist(), local):
            view = cache.get(chunk)
            starts, ends, values = self._view(chunk) if view is None else view
            views.append(values[starts[row] : ends[row]])
        return views

    def flat(self) -> FlatColumn | None:
        """The column as one flat array of values (built once per process; ``None`` when the
        values are not null-free integers)."""
        if self._flat is False:
            self._flat = FlatColumn.of(self._column, self._starts)
        return self._flat

    def rows_and_lengths(self, indices: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        """Zero-copy views of several rows and their lengths."""
        views = self.rows(indices)
        return views, np.fromiter(map(len, views), dtype=np.int64, count=len(views))

    def lengths(self) -> np.ndarray:
        """Every row's length, from the offsets alone (no values are read)."""
        count = self._column.num_chunks
        parts = []
        for chunk in range(count):
            starts, ends, _ = self._view(chunk)
            parts.append((ends - starts).astype(np.int64, copy=False))
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)


class FlatColumn:
    """A ``list<int>`` column as two flat zero-copy arrays: every chunk's values, and every chunk's
    offsets, each in one NumPy array.

    Each array starts at the lowest address of its chunks' buffers and ends at the end of the
    highest; only positions inside a chunk's own buffer are ever read, so whatever lies between
    chunks (other buffers, or address space between separate memory-mapped files) is never
    touched. The Arrow column stays alive as the arrays' base. Per chunk two integers are kept
    (three for a list view, whose sizes are a third flat array).

    Args:
        values, value_base: the flat values and each chunk's first value in it.
        offsets, offset_base: the flat offsets and each chunk's first offset in it.
        row_starts: each chunk's first row (and the row count last).
        sizes, size_base: for a list view, the flat row sizes and each chunk's first size in it.
    """

    __slots__ = ("values", "value_base", "offsets", "offset_base", "row_starts", "sizes", "size_base", "_chunk_rows")

    def __init__(self, values: np.ndarray, value_base: np.ndarray, offsets: np.ndarray, offset_base: np.ndarray,
                 row_starts: np.ndarray, sizes: np.ndarray | None = None, size_base: np.ndarray | None = None) -> None:
        self.values, self.value_base = values, value_base
        self.offsets, self.offset_base = offsets, offset_base
        self.row_starts = row_starts
        self.sizes, self.size_base = sizes, size_base
        # When every chunk but the last has the same number of rows (how `datasets` writes a cache),
        # a row's chunk is a division: a binary search per row costs ~30x more on shuffled rows.
        sizes = np.diff(row_starts)
        uniform = len(sizes) > 0 and sizes[0] > 0 and bool(np.all(sizes[:-1] == sizes[0]))
        self._chunk_rows = int(sizes[0]) if uniform else 0

    @staticmethod
    def _span(addresses: list[int], sizes: list[int], dtype: np.dtype, base: Any) -> tuple[np.ndarray, np.ndarray] | None:
        """One array of ``dtype`` over the buffers at ``addresses`` (``sizes`` items each; empty ones
        are skipped) and each one's first item in it; ``None`` when they are not aligned to each other."""
        width = dtype.itemsize
        present = [(address, size) for address, size in zip(addresses, sizes) if size]
        low = min(address for address, _ in present)
        high = max(address + size * width for address, size in present)
        starts = np.array(addresses, dtype=np.int64) - low
        if np.any(starts % width):
            return None
        flat = np.frombuffer(pa.foreign_buffer(low, high - low, base=base), dtype=dtype)
        return flat, np.where(np.array(sizes) > 0, starts // width, 0)

    @classmethod
    def of(cls, column: pa.ChunkedArray, row_starts: np.ndarray) -> FlatColumn | None:
        """The flat arrays of ``column`` (whose chunks start at ``row_starts``), or ``None`` when its
        values are not null-free integers. One pass over the chunks' buffers, once per process
        (~3 µs per chunk: ~0.7 s for a cache of 200,000 record batches).

        Args:
            column: a ``list<int>`` Arrow column.
            row_starts: each chunk's first row, and the row count last.
        """
        kind = column.type
        if not is_list_type(kind) or not pa.types.is_integer(kind.value_type):
            return None
        view = is_view_type(kind)
        value_dtype = np.dtype(kind.value_type.to_pandas_dtype())
        offset_dtype = np.dtype(np.int32 if pa.types.is_list(kind) or pa.types.is_list_view(kind) else np.int64)
        value_addresses, value_sizes, offset_addresses, offset_sizes, size_addresses = [], [], [], [], []
        for chunk in column.iterchunks():
            rows = len(chunk)
            # A list<int> chunk's buffers: validity, offsets, [sizes: a list view,] the values' validity, the values.
            buffers = chunk.buffers()
            offsets, (values_validity, values_data) = buffers[1], buffers[-2:]
            values = chunk.values
            if values_validity is not None and values.null_count:
                return None
            size = len(values) if rows else 0
            value_addresses.append(values_data.address + values.offset * value_dtype.itemsize if size else 0)
            value_sizes.append(size)
            offset_addresses.append(offsets.address + chunk.offset * offset_dtype.itemsize if rows else 0)
            offset_sizes.append((rows + (not view)) if rows else 0)
            if view:
                size_addresses.append(buffers[2].address + chunk.offset * offset_dtype.itemsize if rows else 0)
        if not any(value_sizes):
            return None
        value_span = cls._span(value_addresses, value_sizes, value_dtype, column)
        offset_span = cls._span(offset_addresses, offset_sizes, offset_dtype, column)
        size_span = cls._span(size_addresses, offset_sizes, offset_dtype, column) if view else (None, None)
        if value_span is None or offset_span is None or size_span is None:
            return None
        return cls(*value_span, *offset_span, row_starts, *size_span)

    def positions(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each row's first value in :attr:`values` and its length, for many rows at once.

        Args:
            rows: row indices (an integer array).
        """
        if self._chunk_rows:
            chunks = np.minimum(rows // self._chunk_rows, len(self.row_starts) - 2)
        else:
            chunks = np.searchsorted(self.row_starts, rows, side="right") - 1
        local = rows - self.row_starts[chunks]
        at = self.offset_base[chunks] + local
        first = self.offsets[at].astype(np.int64)
        if self.sizes is not None:
            return self.value_base[chunks] + first, self.sizes[self.size_base[chunks] + local].astype(np.int64)
        return self.value_base[chunks] + first, self.offsets[at + 1] - first

