"""``TextDataModule``: named dataset managers per split, one resumable train stream, named eval loaders.

Lifecycle (Lightning calls these):

* ``prepare_data()`` (once per node): every manager downloads, preprocesses and caches.
* ``setup(stage)`` (every rank): managers load their caches (memory-mapped); managers whose
  ``stages`` exclude the stage are skipped.
* ``train_dataloader()``: the train managers become sources, interleaved by ``weight`` into one
  infinite stream, optionally packed (``train_stream.py``), loaded by a ``StatefulDataLoader``
  (``loading/loaders.py``).
* ``val/test/predict_dataloader()``: one plain, never-shuffled loader per manager, in config
  order; ``dataloader_names[stage][idx]`` is the manager name the model uses to pick its metrics.
  ``validate``/``test``/``predict`` need only their own split's managers (no train data), and a
  stage whose split has no manager fails in ``setup`` with an error naming the split.
* ``state_dict()`` / ``load_state_dict()``: the train data position of *every* rank (Lightning
  writes rank 0's checkpoint only, so the ranks' states are gathered into it), taken after the
  last batch the model consumed, plus a signature of the data config checked on resume (the
  layout: ``loading/checkpoint.py``).
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Literal

import torch
from lightning.pytorch import LightningDataModule

from lightning_tune_data.cache.checksums import VerifyMode
from lightning_tune_data.cache.root import BuildStores, StoreRoot, default_local_cache_dir
from lightning_tune_data.datamodule.batch_hooks import TrainBatchHooks
from lightning_tune_data.datamodule.eval_loaders import eval_loaders
from lightning_tune_data.datamodule.mix_control import MixControl, load_mix_state, train_timeline, with_mix_state
from lightning_tune_data.datamodule.manager_data import (
    close_datasets, loaded_dataset, prepare_datasets, set_up_datasets,
)
from lightning_tune_data.datamodule.splits import SPLITS, dataloader_name, dataloader_names, tell_managers_their_names
from lightning_tune_data.datamodule.node_readers import node_root
from lightning_tune_data.datamodule.stage_checks import check_stage, check_train_documents, trainer_is_evaluating
from lightning_tune_data.datamodule.train_mixture import TrainMixture
from lightning_tune_data.datamodule.train_stream import TrainStreamConfig, normalised_weights
from lightning_tune_data.datamodule.validation import validated_managers
from lightning_tune_data.distributed import current_rank_and_world_size
from lightning_tune_data.keys import MixBy, OverlongPolicy, StoppingStrategy
from lightning_tune_data.loading.checkpoint import (
    CORPUS_FILES_KEY, TrainResume, data_signature, data_state, warn_no_data_state,
)
from lightning_tune_data.loading.loaders import LoaderOptions, MapStyleDocuments, build_train_loader
from lightning_tune_data.loading.resumable_loader import ResumableLoader
from lightning_tune_data.managers import DatasetManager
from lightning_tune_data.mixing.mix_schedule import MixSchedule
from lightning_tune_data.mixing.online_mixing import MixController
from lightning_tune_data.packing import PackingName
from lightning_tune_data.sources.base import TuneIterableDataset
from lightning_tune_data.sources.corpus_source import files_record
from lightning_tune_data.tokenizers import ByteTokenizer, Tokenizer

__all__ = ["TextDataModule", "default_cache_dir"]


def _data_signature_of(dm: "TextDataModule") -> dict[str, Any]:
    _, world_size = current_rank_and_world_size()
    return {**data_signature(
        sources=list(dm.dataset_managers.get("train") or {}), weights=dm.mixture.fixed(dm.train_source_weights),
        mix_by=dm.mix_by, seed=dm.seed, max_seq_len=dm.max_seq_len, batch_size=dm.batch_size,
        num_workers=dm.num_workers, world_size=world_size, packing=dm.packing, stopping_strategy=dm.stopping_strategy,
        train_mode=dm.train_mode), "mix_schedule": dm.mixture.describe(),
        CORPUS_FILES_KEY: {name: files_record(data) for name, data in dm._datasets["train"].items()
                           if hasattr(data, "identity")}}


def default_cache_dir() -> Path:
    """``$LIGHTNING_TUNE_DATA_CACHE`` or ``~/.cache/lightning_tune_data``."""
    return default_local_cache_dir()


class TextDataModule(TrainBatchHooks, LightningDataModule):
    """A Lightning DataModule over named dataset managers, with an exactly resumable train stream.

    Args:
        dataset_managers: ``{split: {name: manager}}`` with split in train|val|test|predict.
            Train managers are interleaved by their ``weight``; their names are the per-source
            metric namespaces. Each val/test/predict manager becomes one named dataloader. A split
            may also be a list of managers; they are then named after their first
            data file's stem (or dataset name), and duplicates are an error.
        tokenizer: the tokenizer used by preprocessing and padding (default ``ByteTokenizer``).
        max_seq_len: longest sequence (tokens) a batch row may hold.
        batch_size: train batch size (rows; packs when packing).
        eval_batch_size: val/test/predict batch size (default: ``batch_size``).
        num_workers: dataloader workers per rank (may change across a resume: the stream is re-split).
        seed: seeds shuffling and interleaving; same seed + config => same batches, bitwise.
        cache_dir: where preprocessed datasets are stored: a local path or an fsspec URL such as
            ``s3://bucket/prefix`` (default ``default_cache_dir()``).
        packing: ``None`` (pad each sample), ``"greedy"``, ``"best_fit"`` or ``"concat"``.
        packing_buffer_size: open packs (not documents) ``best_fit`` keeps and places into.
        overlong: documents longer than ``max_seq_len`` are ``"truncate"``-d or ``"drop"``-ped
            (counted); ``concat`` packing splits them across blocks instead.
        multidataset_stopping_strategy: ``"infinite"`` (default: sources restart with a new shuffle;
            the run ends at ``max_steps``), ``"first_exhausted"`` or ``"all_exhausted"`` (one pass:
            exhausted sources are dropped, the others renormalised).
        train_mode: ``"stream"`` (default) or ``"map"`` (one train manager, no packing,
            map-style data with a seeded stateful sampler).
        pad_to_multiple_of: round padded lengths up to a multiple of this.
        pin_memory, prefetch_factor, persistent_workers: passed to the dataloaders.
        eval_num_workers: workers for eval loaders (default: ``num_workers``).
        train_stream_name: dataloader name of the train stream when there are several train
            managers (with one, the stream takes that manager's name).
        mix_by: what the train sources' weights are shares of: ``"documents"`` (default) or
            ``"tokens"`` (with packing, of the tokens placed in packs).
        resume_data_state: restore the train data position from a checkpoint (default); ``False``
            restarts the train data (the way out of a data config that cannot be resumed).
        prepare_data_per_node: ``True`` (default) runs ``prepare_data`` on the first process of
            every node; ``False`` on global rank 0 only (a ``cache_dir`` every node shares).
        cache_verify: how a reused cache is checked: ``"checksum"`` (default: files changed since
            they were verified are hashed again), ``"full"`` (every file hashed) or ``"size"``.
        storage_options: options of a remote ``cache_dir``'s filesystem (endpoint, credentials).
        local_cache_dir: this node's copies of a remote ``cache_dir``'s stores (``default_cache_dir()``).
        shard_size: new stores close a shard at about this size (``"256MB"``).
        cache_budget: most bytes this node's shard cache keeps for all remote train stores together
            (``"50GB"``): a store larger than its share is read shard by shard (``None``: copied whole).
        shuffle_window: rows a budgeted store's shuffle mixes at once (default: an eighth of its budget share's).
        build_stores: ``prepare_data`` tokenizes a missing store (``"if_missing"``) or fails naming it
            (``"never"``); ``"auto"``: never for a remote ``cache_dir``, if_missing for a local one.
        mix_schedule: train weights that change over the run (``MixSchedule``); ``None``: the managers' weights.
        compact_batches: ``True`` (default): under a Trainer with workers or an accelerator, train batches
            travel compact and ``on_after_batch_transfer`` derives the same full batch on the device.
        mix_controller: sets the train weights from the per-source loss every ``mix_update_every`` optimizer
            steps (``OnlineDataMixing``, any ``MixController``, or a class path with init args); ``None``: off.
        mix_update_every: optimizer steps between two updates of ``mix_controller``.
    """

    def __init__(
        self,
        dataset_managers: dict[str, dict[str, DatasetManager] | list[DatasetManager]],
        tokenizer: Tokenizer | None = None,
        max_seq_len: int = 512,
        batch_size: int = 8,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 42,
        cache_dir: str | None = None,
        packing: PackingName | None = None,
        packing_buffer_size: int = 64,
        overlong: OverlongPolicy = "truncate",
        multidataset_stopping_strategy: StoppingStrategy = "infinite",
        train_mode: Literal["stream", "map"] = "stream",
        pad_to_multiple_of: int | None = None,
        pin_memory: bool = False,
        prefetch_factor: int | None = 2,
        persistent_workers: bool = False,
        eval_num_workers: int | None = None,
        train_stream_name: str = "interleaved",
        mix_by: MixBy = "documents",
        resume_data_state: bool = True,
        cache_verify: VerifyMode = "checksum",
        prepare_data_per_node: bool = True,
        storage_options: dict[str, Any] | None = None,
        local_cache_dir: str | None = None,
        shard_size: int | str = "256MB",
        cache_budget: int | str | None = None,
        shuffle_window: int | None = None,
        build_stores: BuildStores = "auto",
        mix_schedule: MixSchedule | None = None,
        compact_batches: bool = True,
        mix_controller: MixController | None = None,
        mix_update_every: int = 100,
    ) -> None:
        super().__init__()
        self.prepare_data_per_node = prepare_data_per_node
        self.tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
        self.max_seq_len = max_seq_len
        self.batch_size = batch_size
        self.eval_batch_size = batch_size if eval_batch_size is None else eval_batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.store_root = StoreRoot.configured(cache_dir or default_cache_dir(), storage_options, local_cache_dir,
                                               shard_size, cache_budget, shuffle_window, build_stores)
        self.cache_dir = self.store_root.url if self.store_root.is_remote else self.store_root.local_path()
        self.cache_verify = cache_verify
        self.packing, self.packing_buffer_size, self.overlong = packing, packing_buffer_size, overlong
        self.stopping_strategy = multidataset_stopping_strategy
        self.train_mode, self.pad_to_multiple_of = train_mode, pad_to_multiple_of
        self.eval_num_workers = num_workers if eval_num_workers is None else eval_num_workers
        self.train_stream_name, self.mix_by = train_stream_name, mix_by
        self.resume_data_state, self.compact_batches = resume_data_state, bool(compact_batches)
        self.dataset_managers = validated_managers(
            dataset_managers, max_seq_len=max_seq_len, batch_size=batch_size, eval_batch_size=self.eval_batch_size,
            num_workers=num_workers, packing=packing, stopping_strategy=multidataset_stopping_strategy,
            train_mode=train_mode, overlong=overlong, mix_by=mix_by, cache_verify=cache_verify)
        tell_managers_their_names(self.dataset_managers)
        self.mixture = TrainMixture(mix_schedule, self._managers("train"), mix_by)
        self.mix_control = MixControl.configured(mix_controller, mix_update_every, list(self._managers("train")))
        self.train_options = LoaderOptions(batch_size, num_workers, pin_memory, prefetch_factor, persistent_workers)
        self.eval_options = replace(self.train_options, batch_size=self.eval_batch_size, num_workers=self.eval_num_workers)
        self._datasets: dict[str, dict[str, Any]] = {split: {} for split in SPLITS}
        self._overlong_checked = False  # setup checks the train documents' lengths once per datamodule
        self._train_loader: ResumableLoader | None = None
        self._batches_consumed = 0
        self._resume = TrainResume(enabled=resume_data_state)

    @property
    def vocab_size(self) -> int:
        """Vocabulary size of the tokenizer (linked into the model by the CLI)."""
        return int(self.tokenizer.vocab_size)

    @property
    def train_source_weights(self) -> dict[str, float]:
        """Normalised target weight of every train source (the configured mix)."""
        return normalised_weights(self._managers("train"))

    @property
    def dataloader_names(self) -> dict[str, list[str]]:
        """``{split: [names in dataloader_idx order]}``; train has the one stream's name."""
        return dataloader_names(self.dataset_managers, self.train_stream_name)

    def dataloader_name(self, stage: str, idx: int = 0) -> str:
        """Name of dataloader ``idx`` (Lightning's ``dataloader_idx``) of ``stage`` (a stage or split
        name: ``fit``/``train``, ``validate``/``val``, ...): what the model logs its metrics under."""
        return dataloader_name(self.dataloader_names, stage, idx)

    def _managers(self, split: str) -> dict[str, Any]:
        return self.dataset_managers.get(split) or {}

    def prepare_data(self) -> None:
        """Download, preprocess and cache every manager's data (Lightning runs it once per node)."""
        prepare_datasets(self.dataset_managers, self.tokenizer, self.store_root, self.cache_verify)

    def setup(self, stage: str | None = None) -> None:
        """Load the caches every rank needs for ``stage`` (all stages when ``None``).

        Args:
            stage: the Lightning stage about to run (``fit``, ``validate``, ``test``, ``predict``) or ``None``.
        """
        check_stage(self.dataset_managers, stage, getattr(self, "trainer", None), infinite_stream=self.stopping_strategy == "infinite" and self.train_mode == "stream")
        set_up_datasets(self._datasets, self.dataset_managers, stage, self.tokenizer, node_root(self, self.store_root))
        if self._datasets["train"] and not self._overlong_checked:  # one pass over the cached columns, once
            self._overlong_checked = check_train_documents(self._datasets["train"], self._managers("train"),
                                                           self.max_seq_len, self.overlong, self.packing)
        self.mixture.prepare_for(self, getattr(self, "trainer", None), stage)  # the plan of a train mixture

    def teardown(self, stage: str | None = None) -> None:
        """Stop the train loader's workers and let go of the shard cache's threads, pins and mappings of
        every dataset (``stage``: the stage that ended); a later ``train_dataloader`` starts again."""
        if self._train_loader is not None:
            self._train_loader.shutdown_workers()
        close_datasets(self._datasets)

    def dataset(self, split: str, name: str) -> Any:
        """The set-up (memory-mapped) dataset of manager ``name`` of ``split``: after :meth:`setup`."""
        return loaded_dataset(self._datasets, split, name)

    def build_train_stream(self, rank: int = 0, world_size: int = 1) -> TuneIterableDataset:
        """Sources -> interleave by weight -> [pack]: the stream one rank's train loader reads.

        Args:
            rank, world_size: the rank's place in the run (its shard of every source).
        """
        config = TrainStreamConfig(
            seed=self.seed, max_seq_len=self.max_seq_len, overlong=self.overlong,
            stopping_strategy=self.stopping_strategy, mix_by=self.mix_by, stream_name=self.train_stream_name,
            packing=self.packing, packing_buffer_size=self.packing_buffer_size, num_workers=self.num_workers,
            timeline=train_timeline(self))
        return config.build(self._managers("train"), partial(self.dataset, "train"), rank, world_size)

    def train_dataloader(self) -> ResumableLoader:
        """The train stream in a ``StatefulDataLoader``, restored from a checkpoint if one was loaded."""
        rank, world_size = current_rank_and_world_size()
        self._resume.adopt_orders(dict(self._datasets.get("train") or {}))
        if self.train_mode == "map":
            name = next(iter(self._managers("train")))
            dataset = MapStyleDocuments(self.dataset("train", name), name, self.max_seq_len)
        else:
            dataset = self.build_train_stream(rank, world_size)
        loader = build_train_loader(dataset, self.train_collator(), self.train_options, self.seed, rank, world_size,
                                    finite=self.stopping_strategy != "infinite")
        had_state = self._resume.pending is not None
        self._batches_consumed = self._resume.restore(loader, dataset, rank)
        if not had_state and self._train_loader is None and getattr(getattr(self, "trainer", None), "ckpt_path", None):
            warn_no_data_state(type(self).__name__, self.trainer.ckpt_path)
        self._train_loader = loader
        return loader

    def _eval_loaders(self, split: str) -> list[torch.utils.data.DataLoader]:
        return eval_loaders(self._managers(split), partial(self.dataset, split), tokenizer=self.tokenizer,
                            cache_dir=self.store_root.local_dir, max_seq_len=self.max_seq_len,
                            pad_to_multiple_of=self.pad_to_multiple_of, options=self.eval_options)

    def val_dataloader(self) -> list[torch.utils.data.DataLoader]:
        """One loader per val manager, in config order."""
        if not self._managers("val"):  # no val split: nothing to validate, nothing to warn about
            warnings.filterwarnings("ignore", message=r"Total length of `list` across ranks is zero")
        return self._eval_loaders("val")

    def test_dataloader(self) -> list[torch.utils.data.DataLoader]:
        """One loader per test manager, in config order."""
        return self._eval_loaders("test")

    def predict_dataloader(self) -> list[torch.utils.data.DataLoader]:
        """One loader per predict manager, in config order."""
        return self._eval_loaders("predict")

    def data_signature(self) -> dict[str, Any]:
        """What a checkpoint's data state depends on; compared on resume."""
        return _data_signature_of(self)

    def state_dict(self) -> dict[str, Any]:
        """Every rank's train data position after the last consumed batch (a collective under DDP)."""
        if self._train_loader is None:
            return self._resume.pending or {}
        if self._resume.origin is not None and self._batches_consumed == 0:
            return self._resume.origin  # nothing consumed since a resume on a new layout: the old state says it all
        if getattr(self, "trainer", None) is None:  # a manual loop: every batch handed out counts as consumed
            self._batches_consumed = self._train_loader.batches_yielded
        _, world_size = current_rank_and_world_size()
        return with_mix_state(self, data_state(self._train_loader, self._batches_consumed, self.data_signature(), world_size))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Check the checkpoint's data config against this one and keep the state for the train loader.

        Args:
            state_dict: the checkpoint's data state; what can be resumed: :mod:`lightning_tune_data.loading.checkpoint`.
        """
        if state_dict and not trainer_is_evaluating(getattr(self, "trainer", None)):
            self._resume.accept(state_dict, self.data_signature(), self.train_mode)
            if self._resume.enabled:
                load_mix_state(self, state_dict)
