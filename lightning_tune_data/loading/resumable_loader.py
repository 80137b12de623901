"""The train loader's wrapper that makes its saved state match what the model consumed.

Lightning's fit loop fetches one batch ahead of the one the model trains on, so the loader's own
state at checkpoint time is one batch too far. :class:`ResumableLoader` remembers the
``StatefulDataLoader`` state after every yielded batch and hands out the state that matches the
number of batches the model actually consumed. It deliberately has no
``state_dict``/``load_state_dict`` methods: Lightning would otherwise save (one batch too far) and
restore that state itself. The datamodule owns the train data state instead (its checkpoint layout
is :mod:`lightning_tune_data.loading.checkpoint`).

A state is ``{DATASET_KEY: the stream's state, EPOCH_KEY: ...}`` for an in-process stream, or
``{LOADER_KEY: the StatefulDataLoader's state, EPOCH_KEY: ...}`` with workers or map-style data.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_tune_data.collate.compact import compact_tensors
from lightning_tune_data.loading.worker_states import EncodedStateStream

__all__ = ["DATASET_KEY", "EPOCH_KEY", "LOADER_KEY", "ResumableLoader"]

#: State keys: the in-process stream's own state, the ``StatefulDataLoader``'s state, the epoch.
DATASET_KEY = "dataset"
LOADER_KEY = "loader"
EPOCH_KEY = "epoch"

#: What a fetch returns once the loader's iterator has no batch left.
_END = object()


class ResumableLoader:
    """Iterate a ``StatefulDataLoader`` and remember its state after each yielded batch.

    Args:
        loader: the train ``StatefulDataLoader`` (``snapshot_every_n_steps=1``).
        history: how many recent states to keep; must exceed the trainer's prefetch depth.
        end_sync_group: for a *finite* stream under DDP, a (gloo) process group over which every
            fetch agrees whether all ranks still have a batch: when one rank's data ends, every
            rank ends the epoch at that same batch instead of the others waiting forever in the
            next gradient all-reduce (filters, dropped documents or packing make the ranks'
            batch counts differ). ``None``: no agreement (infinite streams never end).
    """

    def __init__(self, loader: StatefulDataLoader, history: int = 8, end_sync_group: Any = None) -> None:
        self.loader = loader
        self.end_sync_group = end_sync_group
        self.batches_yielded = 0
        self.epoch = 0
        self._history: collections.deque[tuple[int, dict[str, Any]]] = collections.deque(maxlen=history)
        # In-process streams are captured through their own state: a cheap snapshot (built into a
        # state only when asked) where the stream offers one, else its state_dict. The
        # StatefulDataLoader's state_dict costs ~40 us of protocol checks per call on Python 3.11.
        # With workers, a TrainDataLoader's iterator records its state by reference, built when asked.
        self._capture_dataset = loader.num_workers == 0 and isinstance(loader.dataset, IterableDataset)
        self._snapshot = getattr(loader.dataset, "snapshot", None) if self._capture_dataset else None
        self._recorded_state: Callable[[], Any] | None = None

    @property
    def dataset(self) -> Any:
        """The dataset the inner loader reads (its workers read it wrapped, to encode its state)."""
        dataset = self.loader.dataset
        return dataset.stream if isinstance(dataset, EncodedStateStream) else dataset

    @property
    def batch_size(self) -> int | None:
        """The inner loader's batch size (Lightning reads it)."""
        return self.loader.batch_size

    @property
    def _iterator(self) -> Any:
        """The inner loader's live iterator. Lightning's teardown (end of fit, or an error) sets
        ``_iterator = None`` on every dataloader; this stops the worker processes then, instead of
        leaving them idle until the datamodule is garbage-collected."""
        return getattr(self.loader, "_iterator", None)

    @_iterator.setter
    def _iterator(self, value: Any) -> None:
        current = getattr(self.loader, "_iterator", None)
        if value is None and current is not None and hasattr(current, "_shutdown_workers"):
            current._shutdown_workers()
        self.loader._iterator = value

    def shutdown_workers(self) -> None:
        """Stop the worker processes of the live iterator, if any (iterating again starts new ones)."""
        self._iterator = None

    def _capture(self) -> dict[str, Any]:
        if self._snapshot is not None:
            return {DATASET_KEY: self._snapshot(), EPOCH_KEY: self.epoch}  # built by state_after on demand
        if self._capture_dataset:
            return {DATASET_KEY: self.loader.dataset.state_dict(), EPOCH_KEY: self.epoch}
        if self._recorded_state is not None:
            return {LOADER_KEY: self._recorded_state(), EPOCH_KEY: self.epoch}  # likewise
        return {LOADER_KEY: self.loader.state_dict(), EPOCH_KEY: self.epoch}

    def _remember(self) -> None:
        self._history.append((self.batches_yielded, self._capture()))

    def restore(self, state: dict[str, Any], batches_yielded: int) -> None:
        """Load a state produced by :meth:`state_after` (before iterating).

        Args:
            state: the loader state after batch ``batches_yielded``.
            batches_yielded: the batches handed out before that state.
        """
        if DATASET_KEY in state:
            self.loader.dataset.load_state_dict(state[DATASET_KEY])
        else:
            self.loader.load_state_dict(state[LOADER_KEY])
        self.epoch = int(state[EPOCH_KEY])
        self.batches_yielded = batches_yielded
        self._history.clear()
        self._history.append((batches_yielded, state))

    def state_after(self, batches: int) -> dict[str, Any]:
        """The loader state right after the ``batches``-th batch was yielded.

        Args:
            batches: how many batches had been handed out (one of the last ``history`` ones).

        Raises:
            RuntimeError: no state after that batch is kept.
        """
        for count, state in reversed(self._history):
            if count == batches:
                return _built(state)
        if not self._history and batches == self.batches_yielded:
            # Nothing iterated yet. Captured lazily: an eager capture would start (and then
            # discard) the worker processes before a restore.
            return _built(self._capture())
        kept = [count for count, _ in self._history]
        raise RuntimeError(
            f"No train loader state recorded after batch {batches} (the loader handed out {self.batches_yielded}; "
            f"states kept after batches {kept}). The saved state is the one after the last batch the model "
            "consumed, which TextDataModule counts in on_before_batch_transfer while a Trainer trains, and only "
            f"the last {self._history.maxlen} states are kept. Take state_dict() from a Trainer callback (as "
            "ModelCheckpoint does), or, in a loop without a Trainer, right after the batch you consumed."
        )

    def _fetcher(self, batches: Iterator[Any]) -> Callable[[], Any]:
        """How the next batch (or ``_END``) is taken from the loader's iterator ``batches``.

        In-process streams skip the iterator's ``__next__`` wrapper, which opens a profiler range
        on every batch (~45 us per batch measured here, a fifth of an unpacked batch, with no
        profiler running), and its sampler of ``None`` indices: the batch is the next
        ``batch_size`` items of the fetcher's own dataset iterator (in one call where the
        iterator has a ``take(count)`` method, as the packer's has), collated by its own
        ``collate_fn``, with its ``drop_last`` end. The batches, the random draws and the end of
        the stream are the iterator's own; under a running profiler the full ``__next__`` is used,
        so its ranges still appear, and with ``pin_memory`` its ``_next_data``.
        """
        next_data = getattr(batches, "_next_data", None)
        if next_data is None or not hasattr(batches, "_num_yielded"):
            return lambda: next(batches, _END)
        if not self._capture_dataset:
            return self._workers_fetcher(batches, next_data)
        fetcher = getattr(batches, "_dataset_fetcher", None)
        size = self.loader.batch_size
        if getattr(batches, "_pin_memory", True) or not getattr(fetcher, "auto_collation", False) or not size:
            def fetch_data() -> Any:
                try:
                    return next_data()
                except StopIteration:
                    return _END
        else:
            items, collate, drop_last = fetcher.dataset_iter, fetcher.collate_fn, fetcher.drop_last
            take = getattr(items, "take", None)  # a stream that hands out a batch's items at once
            if take is None:
                def take(count: int) -> list[Any]:
                    return list(itertools.islice(items, count))

            def fetch_data() -> Any:
                if fetcher.ended:
                    return _END
                data = take(size)
                if len(data) < size:
                    fetcher.ended = True
                    if not data or drop_last:
                        return _END
                return collate(data)

        def fetch() -> Any:
            if torch.autograd._profiler_enabled():
                return next(batches, _END)
            batch = fetch_data()
            if batch is not _END:
                batches._num_yielded += 1
            return batch

        return fetch

    def _workers_fetcher(self, batches: Any, next_data: Callable[[], Any]) -> Callable[[], Any]:
        """How the next batch (or ``_END``) is taken from workers: the iterator's ``_next_data``
        without ``__next__``'s profiler range (under a running profiler, ``__next__`` itself), with
        its bookkeeping (the count of batches yielded, the end), and a compact batch's arrays
        wrapped as tensors."""

        def fetch() -> Any:
            if torch.autograd._profiler_enabled() or batches._sampler_iter is None:
                batch = next(batches, _END)
            else:
                try:
                    batch = next_data()
                except StopIteration:
                    batches._finished = True
                    return _END
                batches._num_yielded += 1
            return _END if batch is _END else compact_tensors(batch)

        return fetch

    def __iter__(self) -> Iterator[Any]:
        sampler = getattr(self.loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self.epoch)  # map-style data: a new shuffle every epoch
        batches = iter(self.loader)
        self._recorded_state = getattr(batches, "recorded_state", None)
        fetch = self._fetcher(batches)
        while True:
            batch = fetch()
            if self.end_sync_group is not None:
                have = torch.tensor([0 if batch is _END else 1], dtype=torch.int32)
                dist.all_reduce(have, op=dist.ReduceOp.MIN, group=self.end_sync_group)
                if not have.item():
                    break  # some rank's data ended: all ranks end the epoch at this batch
            if batch is _END:
                break
            self.batches_yielded += 1
            self._remember()
            yield batch
        self.epoch += 1


def _built(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with a recorded part (a callable: a stream snapshot, or the workers' recorded state)
    built into its state dict, in place, once."""
    for key in (DATASET_KEY, LOADER_KEY):
        if callable(state.get(key)):
            state[key] = state[key]()
    return state
