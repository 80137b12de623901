"""``ArrowSource``: an infinite, sharded, exactly and elastically resumable stream over a cached Arrow dataset.

Mental model: the cache is a memory-mapped Arrow table of tokenized documents. Pass ``e`` over
the source visits positions ``0..n-1`` in the order of a keyed permutation of
``(seed, source name, e)`` that is computed per position, never stored (``permutation.py``), so
memory and start-up do not grow with the number of rows. The ``world_size × num_workers``
shards split each pass by striding over the positions (``pass_order.py``): no two shards read
the same row in a pass, every shard reads the same number of rows, and the
``num_rows % num_shards`` rows left over are skipped in that pass (a different set every pass
when shuffling, the last rows of the file when not).

The state is a handful of integers per shard (pass, positions visited, and after a resume with a
different layout a short list of positions still owed), plus counters. It is the same size at
step 10 and at step 10 million, and it can be merged across shards and re-split for another
number of ranks or workers (see :meth:`ArrowSource.merge_shard_states`).

Rows are read as zero-copy NumPy views into the memory-mapped ``input_ids`` column. A packer
reads blocks of documents instead (:meth:`ArrowSource.read_block`): each document is then its
row reference and the position of its first token in one flat view of the column's values, with
no Python object per document until a batch is collated.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import sys
import traceback
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from lightning_tune_data.distributed import ShardInfo, current_shard
from lightning_tune_data.sources.base import (
    DROPPED_BEFORE,
    EPOCH,
    INPUT_IDS,
    LOSS_MASK,
    SOURCE,
    SOURCE_ROW,
    TRUNCATED_TOKENS,
    TuneIterableDataset,
)
from lightning_tune_data.packing.pieces import token_arrays
from lightning_tune_data.sources.pass_order import PassPlan, ShardPasses, merge_remaining, split_remaining
from lightning_tune_data.sources.permutation import KeyedPermutation, permutation_key
from lightning_tune_data.sources.source_state import SourceCounters, shard_mismatch_error

log = logging.getLogger(__name__)

OVERLONG_POLICIES = ("truncate", "drop")

#: Documents read per step of iteration.
_BLOCK = 512
#: Positions mapped to rows per vectorised permutation call (kept until visited: 128 KiB). A call
#: costs mostly its fixed NumPy steps (cycle-walking repeats the cipher on ever fewer positions), so
#: 16,384 at a time costs ~4 us per 56 rows against ~7-11 us at 4,096.
_ROWS_AHEAD = 16384
#: Chunks up to which reading rows builds the flat token view first (~3 us per chunk, once per
#: process: 30 ms at this count). Beyond it rows are looked up chunk by chunk, unless the packer
#: already built the view, so a cache of many small record batches starts reading at once.
_FLAT_ROWS_MAX_CHUNKS = 10_000

# State keys.
_WALK = "walk"
_COUNTERS = "counters"
_PENDING_GLOBAL = "remaining"


def _name_key(name: str) -> int:
    """A stable 32-bit integer for a source name (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:4], "little")


class ListColumn:
    """Zero-copy NumPy access to one ``list<...>`` column of an Arrow table.

    Start-up reads only the chunk lengths (one int64 per chunk is kept); a chunk's offsets and
    values are turned into NumPy views the first time a row in it is read (the most recent
    ``_CACHED_CHUNKS`` are kept).
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
        self._views: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._flat: _FlatColumn | None | bool = False  # False: not built yet

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _view(self, chunk_index: int) -> tuple[np.ndarray, np.ndarray]:
        view = self._views.get(chunk_index)
        if view is not None:
            return view
        chunk = self._column.chunk(chunk_index)
        if not (pa.types.is_list(chunk.type) or pa.types.is_large_list(chunk.type)):
            raise TypeError(
                f"Source '{self._source}': column '{self._name}' has type {chunk.type}, expected a list of "
                "integers. Re-run prepare_data with a preprocess function that returns lists."
            )
        values = chunk.values
        if pa.types.is_boolean(values.type):
            array = values.to_numpy(zero_copy_only=False)
        else:
            array = values.to_numpy(zero_copy_only=values.null_count == 0)
        view = (chunk.offsets.to_numpy(), array)
        self._views[chunk_index] = view
        if len(self._views) > self._CACHED_CHUNKS:
            self._views.popitem(last=False)
        return view

    def row(self, index: int) -> np.ndarray:
        if self._single:
            chunk, local = 0, index
        else:
            chunk = int(np.searchsorted(self._starts, index, side="right")) - 1
            local = index - int(self._starts[chunk])
        offsets, values = self._view(chunk)
        return values[offsets[local] : offsets[local + 1]]

    def rows(self, indices: np.ndarray) -> list[np.ndarray]:
        """Zero-copy views of several rows (one vectorised chunk lookup for all of them)."""
        if self._single:
            offsets, values = self._view(0)
            return [values[b:e] for b, e in zip(offsets[indices].tolist(), offsets[indices + 1].tolist())]
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
            offsets, values = self._view(chunk) if view is None else view
            views.append(values[offsets[row] : offsets[row + 1]])
        return views

    def flat(self) -> _FlatColumn | None:
        """The column as one flat array of values (built once per process; ``None`` when the
        values are not null-free integers)."""
        if self._flat is False:
            self._flat = _FlatColumn.of(self._column, self._starts)
        return self._flat

    def rows_and_lengths(self, indices: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
        """Zero-copy views of several rows and their lengths."""
        views = self.rows(indices)
        return views, np.fromiter(map(len, views), dtype=np.int64, count=len(views))

    def lengths(self) -> np.ndarray:
        """Every row's length, from the offsets alone (no values are read)."""
        count = self._column.num_chunks
        return np.concatenate([np.diff(self._view(i)[0]) for i in range(count)]) if count else np.zeros(0, np.int64)


class _FlatColumn:
    """A ``list<int>`` column as two flat zero-copy arrays: every chunk's values, and every chunk's
    offsets, each in one NumPy array.

    Each array starts at the lowest address of its chunks' buffers and ends at the end of the
    highest; only positions inside a chunk's own buffer are ever read, so whatever lies between
    chunks (other buffers, or address space between separate memory-mapped files) is never
    touched. The Arrow column stays alive as the arrays' base. Per chunk two integers are kept.

    Args:
        values, value_base: the flat values and each chunk's first value in it.
        offsets, offset_base: the flat offsets and each chunk's first offset in it.
        row_starts: each chunk's first row (and the row count last).
    """

    __slots__ = ("values", "value_base", "offsets", "offset_base", "row_starts", "_chunk_rows")

    def __init__(self, values: np.ndarray, value_base: np.ndarray, offsets: np.ndarray, offset_base: np.ndarray,
                 row_starts: np.ndarray) -> None:
        self.values, self.value_base = values, value_base
        self.offsets, self.offset_base = offsets, offset_base
        self.row_starts = row_starts
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
    def of(cls, column: pa.ChunkedArray, row_starts: np.ndarray) -> _FlatColumn | None:
        """The flat arrays of ``column`` (whose chunks start at ``row_starts``), or ``None`` when its
        values are not null-free integers. One pass over the chunks' buffers, once per process
        (~3 µs per chunk: ~0.7 s for a cache of 200,000 record batches)."""
        kind = column.type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_integer(kind.value_type):
            return None
        value_dtype = np.dtype(kind.value_type.to_pandas_dtype())
        offset_dtype = np.dtype(np.int32 if pa.types.is_list(kind) else np.int64)
        value_addresses, value_sizes, offset_addresses, offset_sizes = [], [], [], []
        for chunk in column.iterchunks():
            rows = len(chunk)
            # A list<int> chunk's buffers: validity, offsets, the values' validity, the values.
            _, offsets, values_validity, values_data = chunk.buffers()
            values = chunk.values
            if values_validity is not None and values.null_count:
                return None
            size = len(values) if rows else 0
            value_addresses.append(values_data.address + values.offset * value_dtype.itemsize if size else 0)
            value_sizes.append(size)
            offset_addresses.append(offsets.address + chunk.offset * offset_dtype.itemsize if rows else 0)
            offset_sizes.append(rows + 1 if rows else 0)
        if not any(value_sizes):
            return None
        value_span = cls._span(value_addresses, value_sizes, value_dtype, column)
        offset_span = cls._span(offset_addresses, offset_sizes, offset_dtype, column)
        if value_span is None or offset_span is None:
            return None
        return cls(*value_span, *offset_span, row_starts)

    def positions(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each row's first value in :attr:`values` and its length, for many rows at once."""
        if self._chunk_rows:
            chunks = np.minimum(rows // self._chunk_rows, len(self.row_starts) - 2)
        else:
            chunks = np.searchsorted(self.row_starts, rows, side="right") - 1
        at = self.offset_base[chunks] + (rows - self.row_starts[chunks])
        first = self.offsets[at].astype(np.int64)
        return self.value_base[chunks] + first, self.offsets[at + 1] - first


class DocumentBlock:
    """Consecutive documents of one source and pass: their tokens and row references, in order.

    Args:
        source, epoch: the source's name and the pass the documents belong to.
        tokens: each document's tokens: with ``store``, the position of its first token in
            ``store.flat_tokens()`` (an ``int``, no per-document object); without, a zero-copy view.
        lengths: each document's length (already cut to the length policy).
        rows: each document's row in the source.
        truncated_tokens: tokens cut from each document by the length policy.
        dropped_before: overlong documents dropped before each document since the previous one.
        start_state: the source's state just before the block was read.
        read_lengths: the length of every row read for the block, before the length policy.
        kept: the position among the rows read of each document in the block.
        store: the source whose flat token array ``tokens`` index, or ``None``.

    With ``start_state``, ``read_lengths`` and ``kept``, :meth:`ArrowSource.state_after_block`
    gives the source's state after any number of the block's documents, so a reader that holds
    documents of a block saves positions, not documents.
    """

    __slots__ = ("source", "epoch", "tokens", "lengths", "rows", "truncated_tokens", "dropped_before", "start_state",
                 "read_lengths", "kept", "store", "_skipped")

    def __init__(self, source: str, epoch: int, tokens: list[Any], lengths: list[int], rows: list[int],
                 truncated_tokens: list[int], dropped_before: list[int], start_state: dict[str, Any],
                 read_lengths: np.ndarray, kept: np.ndarray, store: ArrowSource | None) -> None:
        self.source = source
        self.epoch = epoch
        self.tokens = tokens
        self.lengths = lengths
        self.rows = rows
        self.truncated_tokens = truncated_tokens
        self.dropped_before = dropped_before
        self.start_state = start_state
        self.read_lengths = read_lengths
        self.kept = kept
        self.store = store
        self._skipped: tuple[list[int], list[int]] | None = None

    @property
    def stores(self) -> dict[str, ArrowSource]:
        """The sources whose flat token arrays the block's positions index, by name."""
        return {} if self.store is None else {self.source: self.store}

    @property
    def input_ids(self) -> list[np.ndarray]:
        """Each document's tokens as a zero-copy view."""
        return token_arrays(self.references(), self.tokens, self.stores)

    def skipped_through(self, read: int, max_seq_len: int | None) -> tuple[int, int]:
        """How many of the first ``read`` rows read were empty, and how many longer than ``max_seq_len``."""
        if self._skipped is None:
            lengths = self.read_lengths
            over = np.zeros(len(lengths), np.int64) if max_seq_len is None else np.cumsum(lengths > max_seq_len)
            self._skipped = (np.cumsum(lengths == 0).tolist(), over.tolist())
        return self._skipped[0][read - 1], self._skipped[1][read - 1]

    def references(self) -> list[tuple]:
        """Per document ``(source, row, epoch, 0, length, True, truncated_tokens, dropped_before)``,
        the packer's piece references, built in one pass."""
        count = len(self.rows)
        return list(zip(itertools.repeat(self.source, count), self.rows, itertools.repeat(self.epoch, count),
                        itertools.repeat(0, count), self.lengths, itertools.repeat(True, count),
                        self.truncated_tokens, self.dropped_before))


def arrow_table(dataset: Any) -> pa.Table:
    """The Arrow table behind a ``datasets.Dataset`` (or a table itself), indices flattened."""
    if isinstance(dataset, pa.Table):
        return dataset
    if getattr(dataset, "_indices", None) is not None:
        dataset = dataset.flatten_indices()
    return dataset.data.table


class ArrowSource(TuneIterableDataset):
    """Infinite, sharded, deterministic, resumable stream of documents from an Arrow dataset.

    Args:
        dataset: a ``datasets.Dataset`` (memory-mapped cache) or ``pyarrow.Table`` with an
            ``input_ids`` list column and optionally a ``loss_mask`` list column.
        dataset_name: the source's name; namespaces state and metrics (the manager name).
        seed: base seed; pass ``e`` uses the permutation keyed by ``(seed, name, e)``.
        shuffle: permute rows every pass; ``False`` keeps file order.
        rank, world_size: the DDP coordinates, captured in the main process.
        num_passes: stop after this many passes; ``None`` (default) means infinite.
        message_transform, model_transform, output_transform: optional per-sample callables
            applied in that order to each document sample. They must be deterministic: a
            resume re-reads documents held in open packs and transforms them again.
        filter_fn: optional predicate ``filter_fn(sample, **filter_kwargs) -> bool``; ``False``
            skips the sample.
        filter_kwargs: keyword arguments for ``filter_fn``.
        max_error_count: how many samples whose transforms raise may be skipped (and counted)
            before iteration fails with the first failure's traceback and row.
        max_seq_len: with ``overlong``, the policy for documents longer than this.
        overlong: ``"truncate"`` (keep the first ``max_seq_len`` tokens) or ``"drop"``; both are
            counted, and each yielded document says how many tokens it lost
            (``truncated_tokens``) and how many documents were dropped before it
            (``dropped_before``).

    Empty documents are skipped and counted (``empty_skipped``); a pass that yields nothing
    raises an error naming the source and the shard instead of looping forever.
    """

    def __init__(
        self,
        dataset: Any,
        dataset_name: str,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        num_passes: int | None = None,
        message_transform: Callable[[dict], dict] | None = None,
        model_transform: Callable[[dict], dict] | None = None,
        output_transform: Callable[[dict], dict] | None = None,
        filter_fn: Callable[..., bool] | None = None,
        filter_kwargs: dict[str, Any] | None = None,
        max_error_count: int = 0,
        max_seq_len: int | None = None,
        overlong: str = "truncate",
    ) -> None:
        if overlong not in OVERLONG_POLICIES:
            raise ValueError(f"Source '{dataset_name}': overlong={overlong!r}; use one of {OVERLONG_POLICIES}.")
        if num_passes is not None and num_passes < 1:
            raise ValueError(f"Source '{dataset_name}': num_passes must be >= 1 or None, got {num_passes}.")
        self._dataset = dataset
        self._name = dataset_name
        self.seed = int(seed)
        self.shuffle = shuffle
        self.rank = rank
        self.world_size = world_size
        self.num_passes = num_passes
        self._transforms = [t for t in (message_transform, model_transform, output_transform) if t is not None]
        self._filter_fn = filter_fn
        self._filter_kwargs = dict(filter_kwargs or {})
        self.max_error_count = max_error_count
        self.max_seq_len = max_seq_len
        self.overlong = overlong
        self._num_rows = len(dataset) if not isinstance(dataset, pa.Table) else dataset.num_rows
        if self._num_rows == 0:
            raise ValueError(f"Source '{dataset_name}' has no rows; check its data files and filters.")
        self._counters = SourceCounters()
        self._first_failure: str | None = None
        self._dropped_since_yield = 0
        self._block_pass: list[Any] | None = None  # read_block's [pass, documents read, counters at its start]
        self._walk: ShardPasses | None = None
        self._remaining: dict[str, Any] | None = None  # set by load_global_state, split on first use
        # Built lazily in the process that iterates (a dataloader worker, usually).
        self._input_ids: ListColumn | None = None
        self._loss_mask: ListColumn | None = None
        self._permutations: dict[int, KeyedPermutation] = {}
        self._rows_ahead: tuple[PassPlan, int, np.ndarray] | None = None  # (plan, its taken count, rows)
        self._cursor: list[Any] | None = None  # [plan, documents of its block read, of them applied to the plan]
        self._flat_view: tuple[memoryview, np.dtype] | None = None

    # -- contract -------------------------------------------------------------------------
    @property
    def dataset_name(self) -> str:
        return self._name

    @property
    def num_rows(self) -> int:
        return self._num_rows

    @property
    def counters(self) -> dict[str, int]:
        """What this shard skipped so far, by reason (see :class:`SourceCounters`)."""
        return self._counters.state_dict()

    def rows_per_shard(self, shard: ShardInfo) -> int:
        """Rows each shard visits per pass of its layout (the same for every shard)."""
        return self._num_rows // shard.num_shards

    def __getstate__(self) -> dict[str, Any]:
        self._settle()
        state = self.__dict__.copy()
        state["_cursor"] = None
        state["_input_ids"] = state["_loss_mask"] = None
        state["_permutations"] = {}
        state["_rows_ahead"] = None
        state["_flat_view"] = None
        return state

    def _shard_walk(self) -> ShardPasses:
        """This shard's walk: resolved from a loaded global state on first use, else fresh."""
        shard = current_shard(self.rank, self.world_size)
        if self._remaining is not None:
            remaining, self._remaining = self._remaining, None
            self._walk = split_remaining(remaining[_WALK], self._num_rows, shard.num_shards, shard.shard_id)
            self._counters = SourceCounters.from_state(remaining[_COUNTERS]) if shard.shard_id == 0 else SourceCounters()
        elif self._walk is None:
            self._walk = ShardPasses(self._num_rows, shard.num_shards, shard.shard_id)
        elif (self._walk.num_shards, self._walk.shard_id) != (shard.num_shards, shard.shard_id):
            raise shard_mismatch_error(self._name, self._walk.shard_id, self._walk.num_shards, shard)
        return self._walk

    def state_dict(self) -> dict[str, Any]:
        return self.snapshot()()

    def snapshot(self) -> Callable[[], dict[str, Any]]:
        """A record of the position after the last document handed out, taken in a few
        microseconds; calling it returns :meth:`state_dict`'s result for that position. The train
        loader takes one after every batch and builds the state only when a checkpoint asks."""
        self._settle()
        walk, counters, name = self._shard_walk().snapshot(), self._counters.state_dict(), self._name
        return lambda: {name: {_WALK: walk(), _COUNTERS: dict(counters)}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        own = self._own_state(state_dict)
        self._check_rows(own[_WALK])
        walk = ShardPasses.from_state(own[_WALK])
        shard = current_shard(self.rank, self.world_size)
        if (walk.num_shards, walk.shard_id) != (shard.num_shards, shard.shard_id):
            raise shard_mismatch_error(self._name, walk.shard_id, walk.num_shards, shard)
        self._walk = walk
        self._remaining = None
        self._cursor = None
        self._counters = SourceCounters.from_state(own[_COUNTERS])

    def merge_shard_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        """What every old shard left unread, from all their states (for a resume with another layout)."""
        owns = [self._own_state(s) for s in states]
        for own in owns:
            self._check_rows(own[_WALK])
        return {
            self._name: {
                _WALK: merge_remaining([own[_WALK] for own in owns], self._name),
                _COUNTERS: SourceCounters.total([own[_COUNTERS] for own in owns]).state_dict(),
            }
        }

    def load_global_state(self, global_state: dict[str, Any]) -> None:
        self._remaining = self._own_state(global_state)
        self._walk = None
        self._cursor = None

    def _check_rows(self, walk_state: dict[str, Any]) -> None:
        saved = int(walk_state["num_rows"])
        if saved != self._num_rows:
            raise ValueError(
                f"Source '{self._name}': the checkpoint was written for {saved} rows but the cache now has "
                f"{self._num_rows}. The data changed, so the saved position means nothing; restore the original "
                "data files, or resume with `resume_data_state: false` to start the data from the beginning."
            )

    # -- reading --------------------------------------------------------------------------
    def _columns(self) -> None:
        if self._input_ids is not None:
            return
        table = arrow_table(self._dataset)
        if INPUT_IDS not in table.column_names:
            raise KeyError(
                f"Source '{self._name}': the cached dataset has no '{INPUT_IDS}' column (columns: "
                f"{table.column_names}). The preprocess function must return '{INPUT_IDS}'."
            )
        self._input_ids = ListColumn(table.column(INPUT_IDS), INPUT_IDS, self._name)
        if LOSS_MASK in table.column_names:
            self._loss_mask = ListColumn(table.column(LOSS_MASK), LOSS_MASK, self._name)

    def _permutation(self, epoch: int) -> KeyedPermutation:
        permutation = self._permutations.get(epoch)
        if permutation is None:
            key = permutation_key(self.seed, self._name, epoch)
            permutation = KeyedPermutation(self._num_rows, key, shuffle=self.shuffle)
            self._permutations = {epoch: permutation}
        return permutation

    def _upcoming_rows(self, plan: PassPlan, limit: int) -> np.ndarray:
        """Rows of the plan's next up to ``limit`` positions, without advancing.

        The permutation is evaluated for ``_ROWS_AHEAD`` positions at a time and kept until they
        are visited: one vectorised call per few thousand documents instead of one per block.
        """
        cached, taken = self._rows_ahead, plan.taken
        if cached is None or cached[0] is not plan or not cached[1] <= taken < cached[1] + len(cached[2]):
            cached = self._rows_ahead = (plan, taken, self._permutation(plan.epoch)(plan.upcoming(_ROWS_AHEAD)))
        offset = taken - cached[1]
        return cached[2][offset : offset + limit]

    def _document(self, row: int, epoch: int) -> dict[str, Any]:
        sample: dict[str, Any] = {INPUT_IDS: self._input_ids.row(row), SOURCE: self._name, EPOCH: epoch, SOURCE_ROW: row}
        if self._loss_mask is not None:
            sample[LOSS_MASK] = self._loss_mask.row(row).astype(bool, copy=False)
        return sample

    def _transformed(self, sample: dict[str, Any], row: int, count: bool = True) -> dict[str, Any] | None:
        """Apply transforms and filter; ``None`` means skip. Raises past the error budget."""
        try:
            for transform in self._transforms:
                sample = transform(sample)
            if self._filter_fn is not None and not self._filter_fn(sample, **self._filter_kwargs):
                self._counters.filtered += count
                return None
        except Exception:  # noqa: BLE001 - user transforms may raise anything; we count and re-raise
            if not count:
                return None
            self._counters.errors += 1
            if self._first_failure is None:
                self._first_failure = f"row {row}:\n{traceback.format_exc()}"
            if self._counters.errors > self.max_error_count:
                raise RuntimeError(
                    f"Source '{self._name}': {self._counters.errors} samples failed their transforms, "
                    f"more than max_error_count={self.max_error_count}. First failure at "
                    f"{self._first_failure}Fix the transform or raise max_error_count on this source."
                ) from None
            return None
        sample.setdefault(SOURCE_ROW, row)
        return sample

    def _apply_length_policy(self, sample: dict[str, Any], count: bool = True) -> dict[str, Any] | None:
        length = len(sample[INPUT_IDS])
        if length == 0:
            self._counters.empty_skipped += count
            return None
        if self.max_seq_len is None or length <= self.max_seq_len:
            return sample
        if self.overlong == "drop":
            self._counters.overlong_dropped += count
            self._dropped_since_yield += count
            return None
        self._counters.overlong_truncated += count
        sample = dict(sample)
        sample[INPUT_IDS] = sample[INPUT_IDS][: self.max_seq_len]
        if LOSS_MASK in sample:
            sample[LOSS_MASK] = sample[LOSS_MASK][: self.max_seq_len]
        sample[TRUNCATED_TOKENS] = length - self.max_seq_len
        return sample

    def read_document(self, source: str, row: int, epoch: int) -> dict[str, Any] | None:
        """Document ``row`` as this source yields it in pass ``epoch`` (``None`` if it is not ours)."""
        if source != self._name:
            return None
        self._columns()
        sample = self._document(int(row), int(epoch))
        if self._transforms or self._filter_fn is not None:
            sample = self._transformed(sample, int(row), count=False)
            if sample is None:
                return None
        return self._apply_length_policy(sample, count=False)

    # -- blocks of document references (the packer's fast path) ------------------------------
    def blocks_supported(self) -> bool:
        """Whether :meth:`read_block` may be used: no transforms, no filter, no loss mask column."""
        self._columns()
        return not self._transforms and self._filter_fn is None and self._loss_mask is None

    def read_block(self, limit: int = _BLOCK) -> DocumentBlock | None:
        """The next up to ``limit`` documents of this shard, exactly as iteration would yield them.

        Advances the state past them (the caller holds the block until it has used it), applies
        the length policy and counts what it skips, like :meth:`__iter__`. ``None``: the last
        pass (``num_passes``) is over. Only when :meth:`blocks_supported`.
        """
        shard = current_shard(self.rank, self.world_size)
        if self.rows_per_shard(shard) == 0:
            raise ValueError(
                f"Source '{self._name}' has {self._num_rows} rows, fewer than its {shard.num_shards} shards; lower "
                "num_workers or add data."
            )
        self._settle()
        walk = self._shard_walk()
        self._columns()
        while self.num_passes is None or walk.epoch < self.num_passes:
            plan, epoch = walk.plan, walk.epoch
            if plan.untouched_fresh and len(plan) > 0:
                self._block_pass = [epoch, 0, self._counters.snapshot()]
            if plan.done:
                judge = self._block_pass
                if judge is not None and judge[0] == epoch and judge[1] == 0:
                    raise RuntimeError(
                        f"Source '{self._name}': a full pass over shard {shard.shard_id} of {shard.num_shards} ({len(plan)} "
                        f"rows) produced no usable document ({self._counters.since(judge[2])}). Check the data "
                        "(empty documents are skipped) and the overlong policy."
                    )
                walk.next_pass()
                continue
            rows = self._upcoming_rows(plan, limit)
            start_state = self.state_dict()
            plan.advance(len(rows))
            block = self._block_of(rows, epoch, start_state)
            if block is not None:
                if self._block_pass is not None and self._block_pass[0] == epoch:
                    self._block_pass[1] += len(block.rows)
                return block
        return None

    def _block_of(self, rows: np.ndarray, epoch: int, start_state: dict[str, Any]) -> DocumentBlock | None:
        """The documents at ``rows`` after the length policy (counting what it skips), in bulk."""
        flat = self._input_ids.flat()
        if flat is not None:  # positions in the flat token array: no object per document
            positions, lengths = flat.positions(rows)
            tokens: Any = positions
        else:
            tokens, lengths = self._input_ids.rows_and_lengths(rows)
        keep = lengths > 0
        self._counters.empty_skipped += len(lengths) - int(np.count_nonzero(keep))
        truncated = dropped_before = None
        kept_lengths = lengths
        cap = self.max_seq_len
        if cap is not None and int(lengths.max(initial=0)) > cap:
            over = lengths > cap
            if self.overlong == "drop":
                dropped = np.cumsum(over)
                self._counters.overlong_dropped += int(dropped[-1])
                keep &= ~over
                kept = np.flatnonzero(keep)
                before = np.diff(dropped[kept], prepend=0)
                if len(kept):
                    before[0] += self._dropped_since_yield
                    self._dropped_since_yield = int(dropped[-1] - dropped[kept[-1]])
                else:
                    self._dropped_since_yield += int(dropped[-1])
                dropped_before = before.tolist()
            else:
                self._counters.overlong_truncated += int(np.count_nonzero(over))
                truncated = np.where(over, lengths - cap, 0)
                kept_lengths = np.minimum(lengths, cap)
                if flat is None:
                    for index in np.flatnonzero(over).tolist():
                        tokens[index] = tokens[index][:cap]
        kept = np.flatnonzero(keep)
        if not len(kept):
            return None
        everything = len(kept) == len(lengths)
        count = len(kept)
        if dropped_before is None:
            dropped_before = [0] * count
            dropped_before[0], self._dropped_since_yield = self._dropped_since_yield, 0
        if flat is not None:
            tokens = (tokens if everything else tokens[kept]).tolist()
        elif not everything:
            tokens = [tokens[i] for i in kept.tolist()]
        return DocumentBlock(
            self._name, epoch,
            tokens,
            (kept_lengths if everything else kept_lengths[kept]).tolist(),
            (rows if everything else rows[kept]).tolist(),
            [0] * count if truncated is None else truncated[kept].tolist(),
            dropped_before,
            start_state,
            lengths,
            kept,
            None if flat is None else self,
        )

    def flat_tokens(self) -> np.ndarray:
        """The ``input_ids`` column's values as one flat array (what a block's positions index)."""
        self._columns()
        flat = self._input_ids.flat()
        if flat is None:
            raise TypeError(f"Source '{self._name}': the '{INPUT_IDS}' values are not null-free integers.")
        return flat.values

    def flat_view(self) -> tuple[memoryview, np.dtype]:
        """:meth:`flat_tokens` as a memoryview, and its dtype (made once per process: the packed
        collator joins every batch's rows from it)."""
        if self._flat_view is None:
            flat = self.flat_tokens()
            self._flat_view = (memoryview(flat), flat.dtype)
        return self._flat_view

    def state_after_block(self, block: DocumentBlock, documents: int) -> dict[str, Any]:
        """This source's state right after the first ``documents`` documents of ``block``.

        The rows read for the block after that document are unread again in this state (a
        resume reads them again, counting what the length policy skips among them then).

        Args:
            block: a block returned by :meth:`read_block` of this source.
            documents: how many of the block's documents have been used (0 to all of them).
        """
        own = block.start_state[self._name]
        if documents == 0:
            return {self._name: {_WALK: own[_WALK], _COUNTERS: dict(own[_COUNTERS])}}
        read = int(block.kept[documents - 1]) + 1  # rows read up to and including that document
        empty, over = block.skipped_through(read, self.max_seq_len)
        counters = dict(own[_COUNTERS])
        counters["empty_skipped"] += empty
        if over:
            counters["overlong_dropped" if self.overlong == "drop" else "overlong_truncated"] += over
        walk = ShardPasses.state_advanced(own[_WALK], read)
        return {self._name: {_WALK: walk, _COUNTERS: counters}}

    def _settle(self) -> None:
        """Advance the plan past the documents the iterator has consumed (see :meth:`__iter__`)."""
        cursor = self._cursor
        if cursor is not None and cursor[1] > cursor[2]:
            cursor[0].advance(cursor[1] - cursor[2])
            cursor[2] = cursor[1]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        shard = current_shard(self.rank, self.world_size)
        if self.rows_per_shard(shard) == 0:
            raise ValueError(
                f"Source '{self._name}' has {self._num_rows} rows, fewer than its {shard.num_shards} shards "
                f"(world_size={shard.world_size} x num_workers={shard.num_workers}). Lower num_workers or "
                "add data."
            )
        self._settle()
        walk = self._shard_walk()
        self._columns()
        plain = not self._transforms and self._filter_fn is None
        name, limit = self._name, self.max_seq_len if self.max_seq_len is not None else sys.maxsize
        while self.num_passes is None or walk.epoch < self.num_passes:
            plan, epoch = walk.plan, walk.epoch
            judged = plan.untouched_fresh and len(plan) > 0
            before = self._counters.snapshot()
            yielded = 0
            while not plan.done:
                rows = self._upcoming_rows(plan, _BLOCK)
                row_list = rows.tolist()
                ids_block = self._input_ids.rows(rows)
                # The plan advances lazily: the cursor counts the block's documents read so far (yielded or
                # skipped), and _settle() applies them before anything looks at the state. While suspended
                # at a yield the state is the same as if the plan had advanced one document at a time.
                cursor = self._cursor = [plan, 0, 0]
                mask_block = None if self._loss_mask is None else self._loss_mask.rows(rows)
                quick = plain and mask_block is None  # a document within the limits is yielded as read
                for position, row, ids in zip(itertools.count(1), row_list, ids_block):
                    cursor[1] = position
                    if quick and 0 < len(ids) <= limit and not self._dropped_since_yield:
                        yielded += 1
                        yield {INPUT_IDS: ids, SOURCE: name, EPOCH: epoch, SOURCE_ROW: row}
                        continue
                    sample = {INPUT_IDS: ids, SOURCE: name, EPOCH: epoch, SOURCE_ROW: row}
                    if mask_block is not None:
                        sample[LOSS_MASK] = mask_block[position - 1].astype(bool, copy=False)
                    if not plain:
                        sample = self._transformed(sample, row)
                        if sample is None:
                            continue
                    sample = self._apply_length_policy(sample)
                    if sample is None:
                        continue
                    if self._dropped_since_yield:
                        sample[DROPPED_BEFORE] = self._dropped_since_yield
                        self._dropped_since_yield = 0
                    yielded += 1
                    yield sample
                cursor[1] = len(row_list)
                self._settle()
            if judged and yielded == 0:
                skipped = self._counters.since(before)
                raise RuntimeError(
                    f"Source '{self._name}': a full pass over shard {shard.shard_id} of {shard.num_shards} "
                    f"({len(plan)} rows) produced no usable document ({skipped}). Check the data (empty "
                    "documents are skipped), filter_fn, the transforms and the overlong policy."
                )
            walk.next_pass()
