"""Dataloader selection: which documents, loader and sampler each split gets.

| split | data | DDP | loader | sampler |
|---|---|---|---|---|
| train | stream (``TuneIterableDataset``) | any | ``StatefulDataLoader`` | none: the stream shards itself by rank x worker |
| train | map-style | yes | ``StatefulDataLoader`` | ``StatefulDistributedSampler`` (shuffled, seeded) |
| train | map-style | no | ``StatefulDataLoader`` | torchdata ``RandomSampler`` (seeded) |
| val / test / predict | ``EvalDocuments`` | any | ``torch.utils.data.DataLoader`` | none: never shuffled, each rank reads its own contiguous block |

The train loader is wrapped in a
:class:`~lightning_tune_data.loading.resumable_loader.ResumableLoader`, which keeps its state in
step with the batches the model consumed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
from torchdata.stateful_dataloader.sampler import RandomSampler, StatefulDistributedSampler

from lightning_tune_data.keys import EPOCH, INPUT_IDS, LOSS_MASK, SOURCE
from lightning_tune_data.loading.known_warnings import ignore_known_third_party_warnings
from lightning_tune_data.loading.resumable_loader import ResumableLoader
from lightning_tune_data.loading.worker_states import TrainDataLoader
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
        """The ``DataLoader`` keyword arguments for a train or an eval loader.

        Args:
            train: a train loader (``drop_last`` as set; workers never persist) or an eval loader.
        """
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

    def row_reader(self) -> Callable[[int], dict[str, Any]]:
        """A function from a row index to that row as a document dict (fast path over Arrow columns)."""
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
        row = self.row_reader()
        for i in range(self.start + worker, self.stop, workers):
            sample = row(i)
            sample[INPUT_IDS] = np.asarray(sample[INPUT_IDS])[: self.max_seq_len]
            if LOSS_MASK in sample:
                sample[LOSS_MASK] = np.asarray(sample[LOSS_MASK], dtype=bool)[: self.max_seq_len]
            sample.setdefault(SOURCE, self.dataset_name)
            sample.setdefault(EPOCH, 0)
            yield sample


class MapStyleDocuments(Dataset):
    """Map-style view of a cached dataset (the ``train_mode="map"`` path of the table).

    Args:
        dataset: a ``datasets.Dataset`` with ``input_ids`` (and optional ``loss_mask``), or a
            sequence of dicts with at least ``input_ids``.
        dataset_name: the source's name; written into each sample's ``source``.
        max_seq_len: documents longer than this are truncated.
    """

    def __init__(self, dataset: Any, dataset_name: str, max_seq_len: int | None = None) -> None:
        if hasattr(dataset, "open_shard"):
            raise ValueError(
                f"Source '{dataset_name}': train_mode 'map' needs the whole store on this node, but it is read shard by "
                "shard through cache_budget. Use train_mode: stream, or remove cache_budget (the store is then copied "
                "to this node whole)."
            )
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
            self._rows = EvalDocuments(self.dataset, self.dataset_name).row_reader()
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

    Args:
        dataset: the train stream, or map-style documents.
        collate_fn: turns a list of samples into a batch.
        options: the train loader options.
        seed: seeds the map-style sampler's shuffle.
        rank, world_size: this rank's place in the run (the map-style sampler's shard).
        finite: the stream ends (a finite stopping strategy); under DDP the ranks then agree at
            every batch whether all still have data (see :class:`ResumableLoader`), on a gloo group.
    """
    ignore_known_third_party_warnings()  # the loader's own deprecation noise, and Lightning's when it wraps it
    kwargs = options.kwargs(train=True)
    if isinstance(dataset, IterableDataset):
        sampler = None
    elif world_size > 1:
        sampler = StatefulDistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
    else:
        sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
    loader = TrainDataLoader(
        dataset, sampler=sampler, collate_fn=collate_fn, snapshot_every_n_steps=1, in_order=True, **kwargs
    )
    group = None
    if finite and world_size > 1 and isinstance(dataset, IterableDataset) and dist.is_initialized():
        group = dist.new_group(backend="gloo")  # collective: train_dataloader runs on every rank
    return ResumableLoader(loader, end_sync_group=group)


def build_eval_loader(dataset: EvalDocuments, collate_fn: Callable[[list[dict]], dict], options: LoaderOptions) -> DataLoader:
    """The val/test/predict row of the selection table: a plain, never-shuffled ``DataLoader``.

    It has no more workers than the rank has rows (a worker without rows would only cost).

    Args:
        dataset: the rank's share of an eval dataset.
        collate_fn: turns a list of samples into a batch.
        options: the eval loader options.
    """
    ignore_known_third_party_warnings()  # Lightning's deprecation noise when it wraps the loaders
    options_kwargs = options.kwargs(train=False)
    if options.num_workers > dataset.num_rows:
        options_kwargs["num_workers"] = dataset.num_rows
        if options_kwargs["num_workers"] == 0:
            options_kwargs.pop("prefetch_factor", None)
            options_kwargs.pop("persistent_workers", None)
    return DataLoader(dataset, collate_fn=collate_fn, **options_kwargs)
