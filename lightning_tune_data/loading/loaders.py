"""Dataloader selection (which loader and sampler each split gets) and the resumable train loader.

| split | data | DDP | loader | sampler |
|---|---|---|---|---|
| train | stream (``TuneIterableDataset``) | any | ``StatefulDataLoader`` | none: the stream shards itself by rank x worker |
| train | map-style | yes | ``StatefulDataLoader`` | ``StatefulDistributedSampler`` (shuffled, seeded) |
| train | map-style | no | ``StatefulDataLoader`` | torchdata ``RandomSampler`` (seeded) |
| val / test / predict | ``EvalDocuments`` | any | ``torch.utils.data.DataLoader`` | none: never shuffled, each rank reads its own contiguous block |

Why :class:`ResumableLoader` exists: Lightning's fit loop fetches one batch ahead of the one the
model trains on, so the loader's own state at checkpoint time is one batch too far. The wrapper
remembers the ``StatefulDataLoader`` state after every yielded batch and hands out the state
that matches the number of batches the model actually consumed. It deliberately has no
``state_dict``/``load_state_dict`` methods: Lightning would otherwise save (one batch too far)
and restore that state itself. The datamodule owns the train data state instead.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler, StatefulDistributedSampler

from lightning_tune_data.keys import EPOCH, INPUT_IDS, LOSS_MASK, SOURCE
from lightning_tune_data.sources.arrow_columns import ListColumn, arrow_table


@dataclass(frozen=True)
class LoaderOptions:
    """Every dataloader option in one place.

    Args:
        batch_size: samples (or packs) per batch; ``>= 1``.
        num_workers: worker processes per rank (a resume with another value re-splits the stream).
        pin_memory: pin batches for faster host-to-GPU copies.
        prefetch_factor: batches each worker prepares ahead (only with workers).
        persistent_workers: keep eval workers alive between evaluations.
        drop_last: always ``True`` for train so every rank yields the same batch shapes.
    """

    batch_size: int
    num_workers: int = 0
    pin_memory: bool = False
    prefetch_factor: int | None = 2
    persistent_workers: bool = False
    drop_last: bool = True

    def kwargs(self, train: bool) -> dict[str, Any]:
        kwargs: dict[str, Any] = {
            "batch_size": self.batch_size,
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
            "drop_last": self.drop_last if train else False,
        }
        if self.num_workers > 0:
            kwargs["prefetch_factor"] = self.prefetch_factor
            kwargs["persistent_workers"] = self.persistent_workers and not train
        return kwargs


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
        # With workers, the StatefulDataLoader's state is a reference to its last worker snapshot.
        self._capture_dataset = loader.num_workers == 0 and isinstance(loader.dataset, IterableDataset)
        self._snapshot = getattr(loader.dataset, "snapshot", None) if self._capture_dataset else None

    @property
    def dataset(self) -> Any:
        return self.loader.dataset

    @property
    def batch_size(self) -> int | None:
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

    def _capture(self) -> dict[str, Any]:
        if self._snapshot is not None:
            return {"dataset": self._snapshot(), "epoch": self.epoch}  # built by state_after on demand
        if self._capture_dataset:
            return {"dataset": self.loader.dataset.state_dict(), "epoch": self.epoch}
        return {"loader": self.loader.state_dict(), "epoch": self.epoch}

    def _remember(self) -> None:
        self._history.append((self.batches_yielded, self._capture()))

    def restore(self, state: dict[str, Any], batches_yielded: int) -> None:
        """Load a state produced by :meth:`state_after` (before iterating)."""
        if "dataset" in state:
            self.loader.dataset.load_state_dict(state["dataset"])
        else:
            self.loader.load_state_dict(state["loader"])
        self.epoch = int(state["epoch"])
        self.batches_yielded = batches_yielded
        self._history.clear()
        self._history.append((batches_yielded, state))

    def state_after(self, batches: int) -> dict[str, Any]:
        """The loader state right after the ``batches``-th batch was yielded."""
        for count, state in reversed(self._history):
            if count == batches:
                if callable(state.get("dataset")):
                    state["dataset"] = state["dataset"]()
                return state
        if not self._history and batches == self.batches_yielded:
            # Nothing iterated yet. Captured lazily: an eager capture would start (and then
            # discard) the worker processes before a restore.
            state = self._capture()
            if callable(state.get("dataset")):
                state["dataset"] = state["dataset"]()
            return state
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
        if not self._capture_dataset or next_data is None or not hasattr(batches, "_num_yielded"):
            return lambda: next(batches, _END)
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

    def __iter__(self) -> Iterator[Any]:
        sampler = getattr(self.loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(self.epoch)  # map-style data: a new shuffle every epoch
        batches = iter(self.loader)
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


_END = object()


def _rank_block(num_rows: int, rank: int, world_size: int) -> tuple[int, int]:
    """Contiguous ``[start, stop)`` rows of ``rank``; blocks differ in size by at most one."""
    base, extra = divmod(num_rows, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


class EvalDocuments(IterableDataset):
    """A rank's share of an eval dataset: every row exactly once across ranks and workers.

    Never shuffled. Rank ``r`` reads a contiguous block of rows; its dataloader workers take
    every ``num_workers``-th row of that block. Works with ``datasets.Dataset`` (fast path over
    the memory-mapped ``input_ids`` column) and any sequence of document dicts.

    Args:
        dataset: a ``datasets.Dataset`` with ``input_ids`` (and optional ``loss_mask``), or a
            sequence of dicts with at least ``input_ids``.
        dataset_name: the dataloader name; written into each sample's ``source``.
        rank, world_size: DDP coordinates captured in the main process.
        max_seq_len: documents longer than this are truncated.
    """

    def __init__(
        self, dataset: Any, dataset_name: str, rank: int = 0, world_size: int = 1, max_seq_len: int | None = None
    ) -> None:
        self.dataset = dataset
        self.dataset_name = dataset_name
        self.rank = rank
        self.world_size = world_size
        self.max_seq_len = max_seq_len
        self.start, self.stop = _rank_block(len(dataset), rank, world_size)

    @property
    def num_rows(self) -> int:
        """Rows this rank reads (no ``__len__``: Lightning would misjudge it with workers)."""
        return self.stop - self.start

    def _rows(self) -> Callable[[int], dict[str, Any]]:
        if isinstance(self.dataset, Sequence) and not hasattr(self.dataset, "data"):
            return lambda i: dict(self.dataset[i])
        table = arrow_table(self.dataset)
        input_ids = ListColumn(table.column(INPUT_IDS), INPUT_IDS, self.dataset_name)
        loss_mask = (
            ListColumn(table.column(LOSS_MASK), LOSS_MASK, self.dataset_name) if LOSS_MASK in table.column_names else None
        )

        def row(i: int) -> dict[str, Any]:
            sample = {INPUT_IDS: input_ids.row(i)}
            if loss_mask is not None:
                sample[LOSS_MASK] = loss_mask.row(i).astype(bool, copy=False)
            return sample

        return row

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        row = self._rows()
        for i in range(self.start + worker, self.stop, workers):
            sample = row(i)
            sample[INPUT_IDS] = np.asarray(sample[INPUT_IDS])[: self.max_seq_len]
            if LOSS_MASK in sample:
                sample[LOSS_MASK] = np.asarray(sample[LOSS_MASK], dtype=bool)[: self.max_seq_len]
            sample.setdefault(SOURCE, self.dataset_name)
            sample.setdefault(EPOCH, 0)
            yield sample


class MapStyleDocuments(Dataset):
    """Map-style view of a cached dataset (the ``train_mode="map"`` path of the table)."""

    def __init__(self, dataset: Any, dataset_name: str, max_seq_len: int | None = None) -> None:
        self.dataset = dataset
        self.dataset_name = dataset_name
        self.max_seq_len = max_seq_len
        self._rows: Callable[[int], dict[str, Any]] | None = None

    def __len__(self) -> int:
        return len(self.dataset)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_rows": None}

    def __getitem__(self, index: int) -> dict[str, Any]:
        if self._rows is None:
            self._rows = EvalDocuments(self.dataset, self.dataset_name)._rows()
        sample = self._rows(int(index))
        sample[INPUT_IDS] = sample[INPUT_IDS][: self.max_seq_len]
        if LOSS_MASK in sample:
            sample[LOSS_MASK] = sample[LOSS_MASK][: self.max_seq_len]
        sample[SOURCE] = self.dataset_name
        sample[EPOCH] = 0
        return sample


def build_train_loader(
    dataset: Dataset | IterableDataset,
    collate_fn: Callable[[list[dict]], dict],
    options: LoaderOptions,
    seed: int,
    rank: int = 0,
    world_size: int = 1,
    finite: bool = False,
) -> ResumableLoader:
    """The train row of the selection table, wrapped for exact resume.

    ``finite``: the stream ends (a finite stopping strategy); under DDP the ranks then agree at
    every batch whether all still have data (see :class:`ResumableLoader`), on a gloo group.
    """
    kwargs = options.kwargs(train=True)
    if isinstance(dataset, IterableDataset):
        sampler = None
    elif world_size > 1:
        sampler = StatefulDistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    else:
        sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    loader = StatefulDataLoader(
        dataset, sampler=sampler, collate_fn=collate_fn, snapshot_every_n_steps=1, in_order=True, **kwargs
    )
    group = None
    if finite and world_size > 1 and isinstance(dataset, IterableDataset) and dist.is_initialized():
        group = dist.new_group(backend="gloo")  # collective: train_dataloader runs on every rank
    return ResumableLoader(loader, end_sync_group=group)


def build_eval_loader(dataset: EvalDocuments, collate_fn: Callable[[list[dict]], dict], options: LoaderOptions) -> DataLoader:
    """The val/test/predict row of the selection table: a plain, never-shuffled ``DataLoader``."""
    options_kwargs = options.kwargs(train=False)
    if options.num_workers > dataset.num_rows:
        options_kwargs["num_workers"] = dataset.num_rows
        if options_kwargs["num_workers"] == 0:
            options_kwargs.pop("prefetch_factor", None)
            options_kwargs.pop("persistent_workers", None)
    return DataLoader(dataset, collate_fn=collate_fn, **options_kwargs)
