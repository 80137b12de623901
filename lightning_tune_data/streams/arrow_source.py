"""``ArrowSource``: an infinite, sharded, exactly resumable stream over a cached Arrow dataset.

Mental model: the cache is a memory-mapped Arrow table of tokenized documents. Pass ``e`` over
the source visits the rows in the order of a permutation that is a pure function of
``(seed, source name, e)``: the same on every rank and worker, so each of the
``world_size × num_workers`` shards takes every ``num_shards``-th row of it and no two shards
ever read the same row in the same pass. Every shard takes exactly ``num_rows // num_shards``
rows per pass, so ranks always have the same amount of data and nobody runs dry; the
``num_rows % num_shards`` rows left over are skipped in that pass (a different set every pass
when shuffling, the last rows of the file when not).

The state is ``(epoch, position)`` plus counters: resuming at step 10 and at step 10 million
costs the same (one permutation of ``num_rows`` integers).

Rows are read as zero-copy NumPy views into the memory-mapped ``input_ids`` column (no Python
row formatting), which is what keeps this source far from being the loader's bottleneck.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from ..distributed import ShardInfo, current_shard
from .base import EPOCH, INPUT_IDS, LOSS_MASK, SOURCE, TuneIterableDataset

log = logging.getLogger(__name__)

OVERLONG_POLICIES = ("truncate", "drop")

# State keys.
_EPOCH = "epoch"
_POSITION = "position"
_ERRORS = "errors"
_FILTERED = "filtered"
_TRUNCATED = "overlong_truncated"
_DROPPED = "overlong_dropped"
_NUM_ROWS = "num_rows"
_NUM_SHARDS = "num_shards"
_SHARD_ID = "shard_id"


def _name_key(name: str) -> int:
    """A stable 32-bit integer for a source name (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:4], "little")


class _ListColumn:
    """Zero-copy NumPy access to one ``list<...>`` column of an Arrow table, chunk by chunk."""

    def __init__(self, column: pa.ChunkedArray, name: str, source: str) -> None:
        self._offsets: list[np.ndarray] = []
        self._values: list[np.ndarray] = []
        for chunk in column.chunks:
            if not (pa.types.is_list(chunk.type) or pa.types.is_large_list(chunk.type)):
                raise TypeError(
                    f"Source '{source}': column '{name}' has type {chunk.type}, expected a list of "
                    "integers. Re-run prepare_data with a preprocess function that returns lists."
                )
            values = chunk.values
            if pa.types.is_boolean(values.type):
                array = values.to_numpy(zero_copy_only=False)
            else:
                array = values.to_numpy(zero_copy_only=values.null_count == 0)
            self._offsets.append(chunk.offsets.to_numpy())
            self._values.append(array)
        lengths = [len(o) - 1 for o in self._offsets]
        self._starts = [0] + np.cumsum(lengths).tolist()  # a list: bisect on it beats np.searchsorted per row

    def __len__(self) -> int:
        return self._starts[-1]

    def row(self, index: int) -> np.ndarray:
        chunk = bisect.bisect_right(self._starts, index) - 1
        local = index - self._starts[chunk]
        offsets = self._offsets[chunk]
        return self._values[chunk][offsets[local] : offsets[local + 1]]


def _arrow_table(dataset: Any) -> pa.Table:
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
        seed: base seed; pass ``e`` uses the permutation seeded by ``(seed, name, e)``.
        shuffle: permute rows every pass; ``False`` keeps file order.
        rank, world_size: the DDP coordinates, captured in the main process.
        num_passes: stop after this many passes; ``None`` (default) means infinite.
        message_transform, model_transform, output_transform: optional per-sample callables
            applied in that order to each document sample (seeds 000/002).
        filter_fn: optional predicate ``filter_fn(sample, **filter_kwargs) -> bool``; ``False``
            skips the sample.
        filter_kwargs: keyword arguments for ``filter_fn``.
        max_error_count: how many samples whose transforms raise may be skipped (and counted)
            before iteration fails with the first failure's traceback and row.
        max_seq_len: with ``overlong``, the policy for documents longer than this.
        overlong: ``"truncate"`` (keep the first ``max_seq_len`` tokens) or ``"drop"``; both are
            counted in the state (``overlong_truncated`` / ``overlong_dropped``).
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
        self._epoch = 0
        self._position = 0
        self._counters = {_ERRORS: 0, _FILTERED: 0, _TRUNCATED: 0, _DROPPED: 0}
        self._first_failure: str | None = None
        # Built lazily in the process that iterates (a dataloader worker, usually).
        self._input_ids: _ListColumn | None = None
        self._loss_mask: _ListColumn | None = None
        self._order_epoch = -1
        self._order: np.ndarray | None = None

    # -- contract -------------------------------------------------------------------------
    @property
    def dataset_name(self) -> str:
        return self._name

    @property
    def num_rows(self) -> int:
        return self._num_rows

    def rows_per_shard(self, shard: ShardInfo) -> int:
        """Rows each shard visits per pass (the same for every shard)."""
        return self._num_rows // shard.num_shards

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_input_ids"] = state["_loss_mask"] = state["_order"] = None
        state["_order_epoch"] = -1
        return state

    def state_dict(self) -> dict[str, Any]:
        shard = current_shard(self.rank, self.world_size)
        return {
            self._name: {
                _EPOCH: self._epoch,
                _POSITION: self._position,
                _NUM_ROWS: self._num_rows,
                _NUM_SHARDS: shard.num_shards,
                _SHARD_ID: shard.shard_id,
                **self._counters,
            }
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        own = self._own_state(state_dict)
        shard = current_shard(self.rank, self.world_size)
        if own[_NUM_ROWS] != self._num_rows:
            raise ValueError(
                f"Source '{self._name}': the checkpoint was written for {own[_NUM_ROWS]} rows but the "
                f"cache now has {self._num_rows}. The data changed; resume is not exact. Start a new run "
                "or restore the original data files."
            )
        if own[_NUM_SHARDS] != shard.num_shards or own[_SHARD_ID] != shard.shard_id:
            raise ValueError(
                f"Source '{self._name}': the checkpoint was written by shard {own[_SHARD_ID]} of "
                f"{own[_NUM_SHARDS]} (world_size x num_workers) but this is shard {shard.shard_id} of "
                f"{shard.num_shards}. Resume with the same world size and num_workers."
            )
        self._epoch = int(own[_EPOCH])
        self._position = int(own[_POSITION])
        for key in self._counters:
            self._counters[key] = int(own.get(key, 0))

    # -- iteration ------------------------------------------------------------------------
    def _columns(self) -> None:
        if self._input_ids is not None:
            return
        table = _arrow_table(self._dataset)
        if INPUT_IDS not in table.column_names:
            raise KeyError(
                f"Source '{self._name}': the cached dataset has no '{INPUT_IDS}' column (columns: "
                f"{table.column_names}). The preprocess function must return '{INPUT_IDS}'."
            )
        self._input_ids = _ListColumn(table.column(INPUT_IDS), INPUT_IDS, self._name)
        if LOSS_MASK in table.column_names:
            self._loss_mask = _ListColumn(table.column(LOSS_MASK), LOSS_MASK, self._name)

    def _shard_order(self, shard: ShardInfo) -> np.ndarray:
        """Rows this shard visits in the current pass, in order."""
        if self._order_epoch != self._epoch or self._order is None:
            if self.shuffle:
                rng = np.random.default_rng([self.seed, _name_key(self._name), self._epoch])
                permutation = rng.permutation(self._num_rows)
            else:
                permutation = np.arange(self._num_rows)
            per_shard = self.rows_per_shard(shard)
            self._order = permutation[shard.shard_id : per_shard * shard.num_shards : shard.num_shards]
            self._order_epoch = self._epoch
        return self._order

    def _document(self, row: int) -> dict[str, Any]:
        sample: dict[str, Any] = {INPUT_IDS: self._input_ids.row(row), SOURCE: self._name, EPOCH: self._epoch}
        if self._loss_mask is not None:
            sample[LOSS_MASK] = self._loss_mask.row(row).astype(bool, copy=False)
        return sample

    def _transformed(self, sample: dict[str, Any], row: int) -> dict[str, Any] | None:
        """Apply transforms and filter; ``None`` means skip. Raises past the error budget."""
        try:
            for transform in self._transforms:
                sample = transform(sample)
            if self._filter_fn is not None and not self._filter_fn(sample, **self._filter_kwargs):
                self._counters[_FILTERED] += 1
                return None
        except Exception:  # noqa: BLE001 - user transforms may raise anything; we count and re-raise
            self._counters[_ERRORS] += 1
            if self._first_failure is None:
                self._first_failure = f"row {row}:\n{traceback.format_exc()}"
            if self._counters[_ERRORS] > self.max_error_count:
                raise RuntimeError(
                    f"Source '{self._name}': {self._counters[_ERRORS]} samples failed their transforms, "
                    f"more than max_error_count={self.max_error_count}. First failure at "
                    f"{self._first_failure}Fix the transform or raise max_error_count on this source."
                ) from None
            return None
        return sample

    def _apply_length_policy(self, sample: dict[str, Any]) -> dict[str, Any] | None:
        if self.max_seq_len is None or len(sample[INPUT_IDS]) <= self.max_seq_len:
            return sample
        if self.overlong == "drop":
            self._counters[_DROPPED] += 1
            return None
        self._counters[_TRUNCATED] += 1
        sample = dict(sample)
        sample[INPUT_IDS] = sample[INPUT_IDS][: self.max_seq_len]
        if LOSS_MASK in sample:
            sample[LOSS_MASK] = sample[LOSS_MASK][: self.max_seq_len]
        return sample

    def __iter__(self) -> Iterator[dict[str, Any]]:
        shard = current_shard(self.rank, self.world_size)
        if self.rows_per_shard(shard) == 0:
            raise ValueError(
                f"Source '{self._name}' has {self._num_rows} rows, fewer than its {shard.num_shards} shards "
                f"(world_size={shard.world_size} x num_workers={shard.num_workers}). Lower num_workers or "
                "add data."
            )
        self._columns()
        plain = not self._transforms and self._filter_fn is None
        while self.num_passes is None or self._epoch < self.num_passes:
            order = self._shard_order(shard)
            started_at_zero = self._position == 0
            yielded = 0
            while self._position < len(order):
                row = int(order[self._position])
                self._position += 1
                sample = self._document(row)
                if not plain:
                    sample = self._transformed(sample, row)
                    if sample is None:
                        continue
                sample = self._apply_length_policy(sample)
                if sample is None:
                    continue
                yielded += 1
                yield sample
            if started_at_zero and yielded == 0:
                raise RuntimeError(
                    f"Source '{self._name}': a full pass over shard {shard.shard_id} of {shard.num_shards} "
                    f"({len(order)} rows) produced no samples (filtered: {self._counters[_FILTERED]}, "
                    f"failed: {self._counters[_ERRORS]}, overlong dropped: {self._counters[_DROPPED]}). "
                    "Check filter_fn, the transforms and the overlong policy."
                )
            self._epoch += 1
            self._position = 0
