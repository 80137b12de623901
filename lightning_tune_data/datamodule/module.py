"""``TextDataModule``: named dataset managers per split, one resumable train stream, named eval loaders.

Lifecycle (Lightning calls these):

* ``prepare_data()`` (once per node): every manager downloads, preprocesses and caches.
* ``setup(stage)`` (every rank): managers load their caches (memory-mapped); managers whose
  ``stages`` exclude the stage are skipped.
* ``train_dataloader()``: the train managers become sources, interleaved by ``weight`` into one
  infinite stream, optionally packed, loaded by a ``StatefulDataLoader`` (see ``loaders.py``).
* ``val/test/predict_dataloader()``: one plain, never-shuffled loader per manager, in config
  order; ``dataloader_names[stage][idx]`` is the manager name the model uses to pick its metrics.
  ``validate``/``test``/``predict`` need only their own split's managers (no train data), and a
  stage whose split has no manager fails in ``setup`` with an error naming the split.
* ``state_dict()`` / ``load_state_dict()``: the train data position of *every* rank (Lightning
  writes rank 0's checkpoint only, so the ranks' states are gathered into it), taken after the
  last batch the model consumed, plus a signature of the data config checked on resume.
"""

from __future__ import annotations

import logging
import math
import os
import warnings
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from lightning.pytorch import LightningDataModule
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn

from lightning_tune_data.collate import PackedCollator, PaddedCollator
from lightning_tune_data.distributed import current_rank_and_world_size
from lightning_tune_data.sources.lengths import overlong_warnings
from lightning_tune_data.loading.loaders import (
    EvalDocuments,
    LoaderOptions,
    MapStyleDocuments,
    ResumableLoader,
    build_eval_loader,
    build_train_loader,
)
from lightning_tune_data.managers import DatasetManager, UnconditionalGenerationDatasetManager
from lightning_tune_data.datamodule.stage_checks import check_stage_has_data, warn_if_validation_never_runs
from lightning_tune_data.sources.arrow import ArrowSource
from lightning_tune_data.sources.base import TuneIterableDataset
from lightning_tune_data.mixing.interleave import MIX_BY, InterleavedDataset
from lightning_tune_data.packing.packer import IterablePackedDataset
from lightning_tune_data.loading.checkpoint import STATE_VERSION, TrainResume
from lightning_tune_data.tokenizers import ByteTokenizer, Tokenizer

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test", "predict")
PACKING_STRATEGIES = ("greedy", "best_fit", "concat")
STOPPING_STRATEGIES = ("infinite", "first_exhausted", "all_exhausted")
#: Lightning stage names (and common aliases) -> split names.
STAGE_TO_SPLIT = {
    "fit": "train",
    "train": "train",
    "training": "train",
    "validate": "val",
    "validation": "val",
    "val": "val",
    "test": "test",
    "predict": "predict",
}
#: Which manager ``stages`` make a split load in ``setup(stage)``.
SPLITS_FOR_STAGE = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("predict",)}

def default_source_name(manager: Any) -> str:
    """Name of a manager given in list form: the first data file's stem, else the dataset's name."""
    if isinstance(manager, UnconditionalGenerationDatasetManager):
        return "unconditional"
    if getattr(manager, "source_name", None):
        return manager.source_name
    files = manager.data_files
    if isinstance(files, dict):
        files = next(iter(files.values()), None)
    if isinstance(files, (list, tuple)):
        files = files[0] if files else None
    if files:
        return Path(str(files)).stem
    parts = [str(manager.path).rstrip("/").split("/")[-1], manager.name]
    return "_".join(p for p in parts if p)


def _named(split: str, managers: Any) -> Any:
    """Normalise the list form (``train: [manager, ...]``) to ``{name: manager}``."""
    if not isinstance(managers, (list, tuple)):
        return managers
    names = [default_source_name(m) if isinstance(m, DatasetManager) else repr(m) for m in managers]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(
            f"TextDataModule.dataset_managers.{split}: duplicate source names {duplicates} (derived from the "
            f"data files / dataset names of {names}). Use the mapping form {{name: manager}} to name them."
        )
    return dict(zip(names, managers))


def default_cache_dir() -> Path:
    """``$LIGHTNING_TUNE_DATA_CACHE`` or ``~/.cache/lightning_tune_data``."""
    env = os.environ.get("LIGHTNING_TUNE_DATA_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "lightning_tune_data"


class TextDataModule(LightningDataModule):
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
        cache_dir: where preprocessed datasets are cached (default ``default_cache_dir()``).
        packing: ``None`` (pad each sample), ``"greedy"``, ``"best_fit"`` or ``"concat"``.
        packing_buffer_size: documents the ``best_fit`` packer may hold to choose from.
        overlong: documents longer than ``max_seq_len`` are ``"truncate"``-d or ``"drop"``-ped
            (counted); ``concat`` packing splits them across blocks instead.
        multidataset_stopping_strategy: ``"infinite"`` (default: every source restarts with a
            new shuffle and the run ends at ``max_steps``), ``"first_exhausted"`` or
            ``"all_exhausted"`` (one pass: exhausted sources are dropped and the others renormalised, so
            every sample is used exactly once).
        train_mode: ``"stream"`` (default) or ``"map"`` (one train manager, no packing,
            map-style data with a seeded stateful sampler).
        pad_to_multiple_of: round padded lengths up to a multiple of this.
        pin_memory, prefetch_factor, persistent_workers: passed to the dataloaders.
        eval_num_workers: workers for eval loaders (default: ``num_workers``).
        train_stream_name: dataloader name of the train stream when there are several train
            managers (with one, the stream takes that manager's name).
        mix_by: what the train sources' weights are shares of: ``"documents"`` (default) or
            ``"tokens"`` (a "30% code" mix then means 30% of the tokens, whatever the sources'
            document lengths; with packing, of the tokens placed in packs).
        resume_data_state: restore the train data position from a checkpoint (default). With
            ``False`` a resumed run keeps the model, optimizer and step but starts the train data
            from the beginning, with a warning: the way out when the data config changed in a
            way that cannot be resumed (sources, seed, ``max_seq_len``, packing).
        prepare_data_per_node: Lightning's switch: ``True`` (default) runs ``prepare_data`` on the
            first process of every node (each node builds its own cache, or waits on the lock of
            a shared ``cache_dir``); ``False`` runs it on global rank 0 only, for a ``cache_dir``
            on a filesystem every node shares: one process tokenizes and every rank memory-maps
            the same cache.
        cache_verify: how ``prepare_data`` checks a cache it reuses: ``"checksum"`` (default:
            hash every file and compare with the checksums recorded when it was written; a
            corrupt cache is rebuilt with a warning naming the file) or ``"size"`` (file sizes
            only, for very large caches; a same-size corruption then goes unnoticed).
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
        packing: Literal["greedy", "best_fit", "concat"] | None = None,
        packing_buffer_size: int = 64,
        overlong: Literal["truncate", "drop"] = "truncate",
        multidataset_stopping_strategy: Literal["infinite", "first_exhausted", "all_exhausted"] = "infinite",
        train_mode: Literal["stream", "map"] = "stream",
        pad_to_multiple_of: int | None = None,
        pin_memory: bool = False,
        prefetch_factor: int | None = 2,
        persistent_workers: bool = False,
        eval_num_workers: int | None = None,
        train_stream_name: str = "interleaved",
        mix_by: Literal["documents", "tokens"] = "documents",
        resume_data_state: bool = True,
        cache_verify: Literal["checksum", "size"] = "checksum",
        prepare_data_per_node: bool = True,
    ) -> None:
        super().__init__()
        self.prepare_data_per_node = prepare_data_per_node
        self.tokenizer = tokenizer if tokenizer is not None else ByteTokenizer()
        self.max_seq_len = max_seq_len
        self.batch_size = batch_size
        self.eval_batch_size = batch_size if eval_batch_size is None else eval_batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
        if cache_verify not in ("checksum", "size"):
            raise ValueError(
                f"TextDataModule.cache_verify: {cache_verify!r} is not 'checksum' or 'size'. Use 'checksum' "
                "(hash every cache file when it is reused) or 'size' (compare file sizes only)."
            )
        self.cache_verify = cache_verify
        self.packing = packing
        self.packing_buffer_size = packing_buffer_size
        self.overlong = overlong
        self.stopping_strategy = multidataset_stopping_strategy
        self.train_mode = train_mode
        self.pad_to_multiple_of = pad_to_multiple_of
        self.eval_num_workers = num_workers if eval_num_workers is None else eval_num_workers
        self.train_stream_name = train_stream_name
        self.mix_by = mix_by
        self.resume_data_state = resume_data_state
        self.dataset_managers = (
            {split: _named(split, managers) for split, managers in dataset_managers.items()}
            if isinstance(dataset_managers, dict)
            else dataset_managers
        )
        self._validate_config()
        for managers in self.dataset_managers.values():
            for name, manager in managers.items():
                manager.source_name = name  # errors then name the source as the config does
        self.train_options = LoaderOptions(batch_size, num_workers, pin_memory, prefetch_factor, persistent_workers)
        self.eval_options = LoaderOptions(
            self.eval_batch_size, self.eval_num_workers, pin_memory, prefetch_factor, persistent_workers
        )
        self._datasets: dict[str, dict[str, Any]] = {split: {} for split in SPLITS}
        self._train_loader: ResumableLoader | None = None
        self._batches_consumed = 0
        self._resume = TrainResume()

    # -- configuration ----------------------------------------------------------------------
    def _validate_config(self) -> None:
        def fail(field: str, problem: str, fix: str) -> None:
            raise ValueError(f"TextDataModule.{field}: {problem}. {fix}")

        if not isinstance(self.dataset_managers, dict):
            fail("dataset_managers", f"expected a dict of splits, got {type(self.dataset_managers).__name__}",
                 "Use {train: {name: manager}, val: {...}}.")
        for split, managers in self.dataset_managers.items():
            if split not in SPLITS:
                fail(f"dataset_managers.{split}", f"unknown split '{split}'", f"Use one of {list(SPLITS)}.")
            if not isinstance(managers, dict):
                fail(f"dataset_managers.{split}", "expected a dict of {name: manager}",
                     "Give every manager a name, e.g. {lm: {class_path: ...}}.")
            for name, manager in managers.items():
                if not isinstance(name, str) or not name.strip():
                    fail(f"dataset_managers.{split}", f"empty or non-string dataloader name {name!r}",
                         "Name every manager with a non-empty string.")
                if not isinstance(manager, (DatasetManager, UnconditionalGenerationDatasetManager)):
                    fail(f"dataset_managers.{split}.{name}", f"expected a DatasetManager, got {type(manager).__name__}",
                         "Use lightning_tune_data.DatasetManager / LocalDatasetManager.")
        if not any(self.dataset_managers.values()):
            fail("dataset_managers", "no split has a manager",
                 "Add managers under dataset_managers.train (and val/test/predict).")
        train = self.dataset_managers.get("train") or {}
        for name, manager in train.items():
            if isinstance(manager, UnconditionalGenerationDatasetManager):
                fail(f"dataset_managers.train.{name}", "UnconditionalGenerationDatasetManager is predict-only",
                     "Move it under dataset_managers.predict.")
        weights = {name: float(m.weight) for name, m in train.items()}
        for name, weight in weights.items():
            if not math.isfinite(weight) or weight < 0:
                fail(f"dataset_managers.train.{name}.weight", f"weight {weight} is not a finite number >= 0",
                     "Give every train source a non-negative weight.")
        if train and sum(weights.values()) <= 0:
            fail("dataset_managers.train", f"weights {weights} sum to 0", "Give at least one source a positive weight.")
        if self.max_seq_len < 2:
            fail("max_seq_len", f"{self.max_seq_len} is too small", "Use at least 2 (room for BOS and EOS).")
        for field in ("batch_size", "eval_batch_size"):
            if getattr(self, field) < 1:
                fail(field, f"{getattr(self, field)} < 1", "Use a batch size of at least 1.")
        if self.num_workers < 0:
            fail("num_workers", f"{self.num_workers} < 0", "Use 0 (main process) or more workers.")
        if self.packing is not None and self.packing not in PACKING_STRATEGIES:
            fail("packing", f"unknown strategy {self.packing!r}", f"Use null or one of {list(PACKING_STRATEGIES)}.")
        if self.stopping_strategy not in STOPPING_STRATEGIES:
            fail("multidataset_stopping_strategy", f"unknown strategy {self.stopping_strategy!r}",
                 f"Use one of {list(STOPPING_STRATEGIES)}.")
        if self.train_mode == "map" and (len(train) != 1 or self.packing is not None):
            fail("train_mode", "'map' needs exactly one train manager and no packing",
                 "Use train_mode: stream for mixtures and packing.")
        if self.overlong not in ("truncate", "drop"):
            fail("overlong", f"unknown policy {self.overlong!r}", "Use 'truncate' or 'drop'.")
        if self.mix_by not in MIX_BY:
            fail("mix_by", f"unknown value {self.mix_by!r}", f"Use one of {list(MIX_BY)}.")

    # -- public names ---------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Vocabulary size of the tokenizer (linked into the model by the CLI)."""
        return int(self.tokenizer.vocab_size)

    @property
    def train_source_weights(self) -> dict[str, float]:
        """Normalised target weight of every train source (the configured mix)."""
        weights = {name: float(m.weight) for name, m in self._managers("train").items()}
        total = sum(weights.values())
        return {name: weight / total for name, weight in weights.items()}

    @property
    def dataloader_names(self) -> dict[str, list[str]]:
        """``{split: [names in dataloader_idx order]}``; train has the one stream's name."""
        train = list(self._managers("train"))
        names = {"train": train if len(train) <= 1 else [self.train_stream_name]}
        for split in ("val", "test", "predict"):
            names[split] = list(self.dataset_managers.get(split) or {})
        return names

    def dataloader_name(self, stage: str, idx: int = 0) -> str:
        """Name of dataloader ``idx`` of ``stage`` (``fit``/``train``, ``validate``/``val``, ...)."""
        split = STAGE_TO_SPLIT.get(stage)
        if split is None:
            raise ValueError(f"Unknown stage '{stage}'; use one of {sorted(STAGE_TO_SPLIT)}.")
        names = self.dataloader_names[split]
        if not 0 <= idx < len(names):
            raise IndexError(f"No {split} dataloader at index {idx}; the {split} dataloaders are {names}.")
        return names[idx]

    def _managers(self, split: str) -> dict[str, Any]:
        return self.dataset_managers.get(split) or {}

    # -- lifecycle --------------------------------------------------------------------------
    def prepare_data(self) -> None:
        """Download, preprocess and cache every manager's data (Lightning runs it once per node)."""
        for split in SPLITS:
            for name, manager in self._managers(split).items():
                if isinstance(manager, UnconditionalGenerationDatasetManager):
                    continue
                log.debug("Preparing %s/%s", split, name)  # the cache prints one line per source
                manager.prepare_data(self.tokenizer, self.cache_dir, cache_verify=self.cache_verify)

    def setup(self, stage: str | None = None) -> None:
        """Load the caches every rank needs for ``stage`` (all stages when ``None``)."""
        if stage in SPLITS_FOR_STAGE:
            check_stage_has_data(self.dataset_managers, stage, SPLITS_FOR_STAGE[stage][0])
            if stage == "fit" and self.stopping_strategy == "infinite" and self.train_mode == "stream":
                warn_if_validation_never_runs(getattr(self, "trainer", None), self._managers("val"))
        stages = SPLITS_FOR_STAGE.keys() if stage is None else [stage]
        for lightning_stage in stages:
            for split in SPLITS_FOR_STAGE.get(lightning_stage, ()):
                for name, manager in self._managers(split).items():
                    if lightning_stage not in manager.stages or name in self._datasets[split]:
                        continue
                    self._datasets[split][name] = manager.setup(self.tokenizer, self.cache_dir)
        if self._datasets["train"] and self.packing != "concat" and not getattr(self, "_overlong_checked", False):
            self._overlong_checked = True  # one pass over the cached lengths, once per datamodule
            for line in overlong_warnings(self._datasets["train"], self.max_seq_len, self.overlong):
                rank_zero_warn(line)

    def _loaded(self, split: str, name: str) -> Any:
        try:
            return self._datasets[split][name]
        except KeyError:
            raise RuntimeError(
                f"{split} dataset '{name}' is not set up. Call prepare_data() and setup() first (the Trainer "
                "does), and check the manager's `stages`."
            ) from None

    # -- train ------------------------------------------------------------------------------
    def _train_sources(self, rank: int, world_size: int) -> list[TuneIterableDataset]:
        num_passes = None if self.stopping_strategy == "infinite" else 1
        length_limit = None if self.packing == "concat" else self.max_seq_len
        sources = []
        for name, manager in self._managers("train").items():
            data = self._loaded("train", name)
            if getattr(manager, "streaming", False):
                from lightning_tune_data.sources.hf_streaming import HFStreamingSource

                sources.append(
                    HFStreamingSource(data, dataset_name=name, seed=self.seed, shuffle=manager.shuffle,
                                      rank=rank, world_size=world_size, num_passes=num_passes,
                                      max_error_count=manager.max_error_count, max_seq_len=length_limit,
                                      overlong=self.overlong, **manager.stream_options())
                )
                continue
            shards = world_size * max(1, self.num_workers)
            if 0 < len(data) < shards:  # fail before any dataloader worker starts (0 rows: ArrowSource says so)
                raise ValueError(
                    f"Train source '{name}' has {len(data)} rows, fewer than its {shards} shards (world_size="
                    f"{world_size} x num_workers={self.num_workers}): some workers would get no data. Lower "
                    "num_workers or add data."
                )
            sources.append(
                ArrowSource(data, dataset_name=name, seed=self.seed, shuffle=manager.shuffle, rank=rank,
                            world_size=world_size, num_passes=num_passes, max_error_count=manager.max_error_count,
                            max_seq_len=length_limit, overlong=self.overlong, **manager.stream_transforms())
            )
        return sources

    def build_train_stream(self, rank: int = 0, world_size: int = 1) -> TuneIterableDataset:
        """Sources -> interleave by weight -> [pack]: the stream one rank's train loader reads."""
        sources = self._train_sources(rank, world_size)
        if len(sources) == 1 and self.stopping_strategy == "infinite":
            stream = sources[0]
        else:
            weights = [float(self.dataset_managers["train"][s.dataset_name].weight) for s in sources]
            stream = InterleavedDataset(sources, weights, seed=self.seed, dataset_name=self.train_stream_name,
                                        stopping_strategy=self.stopping_strategy, rank=rank, world_size=world_size,
                                        mix_by=self.mix_by)
        if self.packing is not None:
            stream = IterablePackedDataset(stream, max_seq_len=self.max_seq_len, strategy=self.packing,
                                           buffer_size=self.packing_buffer_size, overlong=self.overlong)
        return stream

    def train_collator(self) -> PaddedCollator | PackedCollator:
        cls = PackedCollator if self.packing is not None else PaddedCollator
        return cls(pad_id=self.tokenizer.pad_id, max_seq_len=self.max_seq_len, pad_to_multiple_of=self.pad_to_multiple_of)

    def train_dataloader(self) -> ResumableLoader:
        """The train stream in a ``StatefulDataLoader``, restored from a checkpoint if one was loaded."""
        rank, world_size = current_rank_and_world_size()
        if self.train_mode == "map":
            name = next(iter(self._managers("train")))
            dataset = MapStyleDocuments(self._loaded("train", name), name, self.max_seq_len)
        else:
            dataset = self.build_train_stream(rank, world_size)
        loader = build_train_loader(dataset, self.train_collator(), self.train_options, self.seed, rank, world_size,
                                    finite=self.stopping_strategy != "infinite")
        had_state = self._resume.pending is not None
        self._batches_consumed = self._resume.restore(loader, dataset, rank)
        if not had_state and self._train_loader is None and getattr(getattr(self, "trainer", None), "ckpt_path", None):
            rank_zero_warn(
                f"Resuming from {self.trainer.ckpt_path}, which holds no {type(self).__name__} data state (written "
                "by another datamodule, or before the train loader existed): the train data starts from the "
                "beginning, so the batches differ from an uninterrupted run's."
            )
        self._train_loader = loader
        return loader

    # -- eval -------------------------------------------------------------------------------
    def _eval_loaders(self, split: str) -> list[torch.utils.data.DataLoader]:
        rank, world_size = current_rank_and_world_size()
        collator = PaddedCollator(pad_id=self.tokenizer.pad_id, max_seq_len=self.max_seq_len,
                                  pad_to_multiple_of=self.pad_to_multiple_of)
        loaders = []
        for name, manager in self._managers(split).items():
            if isinstance(manager, UnconditionalGenerationDatasetManager):
                prompts = manager.setup(self.tokenizer, self.cache_dir)
                indices = manager.examples_for_rank(rank, world_size)
                data = [dict(prompts[i], source=name) for i in indices]
                dataset = EvalDocuments(data, name, rank=0, world_size=1, max_seq_len=self.max_seq_len)
            else:
                dataset = EvalDocuments(self._loaded(split, name), name, rank, world_size, self.max_seq_len)
            loaders.append(build_eval_loader(dataset, collator, self.eval_options))
        return loaders

    def val_dataloader(self) -> list[torch.utils.data.DataLoader]:
        if not self._managers("val"):  # no val split: nothing to validate, nothing to warn about
            warnings.filterwarnings("ignore", message=r"Total length of `list` across ranks is zero")
        return self._eval_loaders("val")

    def _evaluating(self) -> bool:
        """Whether the Trainer runs validate/test/predict (a checkpoint's train position is then unused)."""
        trainer = getattr(self, "trainer", None)
        fn = getattr(getattr(trainer, "state", None), "fn", None)
        return fn is not None and fn != TrainerFn.FITTING

    def test_dataloader(self) -> list[torch.utils.data.DataLoader]:
        return self._eval_loaders("test")

    def predict_dataloader(self) -> list[torch.utils.data.DataLoader]:
        return self._eval_loaders("predict")

    # -- resume -----------------------------------------------------------------------------
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Count the train batches the model actually consumes (the fit loop prefetches one)."""
        trainer = getattr(self, "trainer", None)
        if trainer is not None and trainer.training:
            self._batches_consumed += 1
        return batch

    def data_signature(self) -> dict[str, Any]:
        """What a checkpoint's data state depends on; compared on resume."""
        _, world_size = current_rank_and_world_size()
        return {
            "sources": sorted(self._managers("train")),
            "weights": {name: round(weight, 12) for name, weight in self.train_source_weights.items()},
            "mix_by": self.mix_by,
            "seed": self.seed,
            "max_seq_len": self.max_seq_len,
            "batch_size": self.batch_size,
            "num_workers": self.num_workers,
            "world_size": world_size,
            "packing": self.packing,
            "stopping_strategy": self.stopping_strategy,
            "train_mode": self.train_mode,
        }

    def state_dict(self) -> dict[str, Any]:
        """Every rank's train data position after the last consumed batch (a collective under DDP).

        Positions and document references only (plain Python types); see ``train_resume.py``.
        """
        if self._train_loader is None:
            return self._resume.pending or {}
        if self._resume.origin is not None and self._batches_consumed == 0:
            return self._resume.origin  # nothing consumed since a resume on a new layout: the old state says it all
        consumed = self._batches_consumed
        if getattr(self, "trainer", None) is None:
            # A manual loop (no Trainer): every batch the loader handed out counts as consumed.
            consumed = self._batches_consumed = self._train_loader.batches_yielded
        own = {"batches_consumed": consumed, "loader": self._train_loader.state_after(consumed)}
        _, world_size = current_rank_and_world_size()
        ranks = [own]
        if world_size > 1:
            ranks = [None] * world_size
            dist.all_gather_object(ranks, own)
        return {"version": STATE_VERSION, "signature": self.data_signature(), "ranks": ranks}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Check the checkpoint's data config against this one and keep the state for the train loader.

        Same layout (world size and ``num_workers``): each rank restores its own position, bitwise
        exact (a changed ``batch_size`` only regroups the same documents into batches). Another
        layout: the positions of all old shards are merged and re-split, so within the pass in
        progress every document is used exactly once across the old and the resumed run. Changed
        sources, seed, ``max_seq_len``, packing, stopping strategy or train mode cannot be resumed:
        the error names them and the ``resume_data_state: false`` way out.
        """
        if not state_dict or self._evaluating():
            return
        if not self.resume_data_state:
            rank_zero_warn(
                "resume_data_state=False: the checkpoint's train data position is ignored. The model, optimizer and "
                "step are restored, but the train data starts again from the beginning, so the model sees documents "
                "it has already trained on."
            )
            return
        self._resume.accept(state_dict, self.data_signature(), self.train_mode)
