"""Lightning callback that logs per-source dataset metrics from the batches the model trained on.

Counting happens in the main process from ``batch["provenance"]`` (computed in the dataloader
workers), for exactly the batches the training loop hands to the model: Lightning fetches one
batch ahead, so counting inside the dataloader would be one batch early.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger

from lightning_tune_data.cache.cached_store import CachedStore
from lightning_tune_data.distributed import current_rank_and_world_size
from lightning_tune_data.keys import PROVENANCE
from lightning_tune_data.metrics.aggregator import DatasetMetricsAggregator
from lightning_tune_data.metrics.collector import CollectorsFactory, MetricsDict, StandardMetricCollector
from lightning_tune_data.metrics.rank_merge import merge_rank_states
from lightning_tune_data.metrics.summary import format_mix_table, mix_notes, tensorboard_layout

__all__ = ["DatasetMetricsCallback", "cache_metrics", "flatten_metrics", "scheduled_targets"]


def scheduled_targets(trainer: pl.Trainer) -> dict[str, float] | None:
    """The mixture's target weights at the trainer's last step: an online controller's (with a
    schedule's), else a schedule's (``None``: fixed weights).

    Args:
        trainer: the trainer, whose datamodule may carry a ``mix_control`` or a ``mixture`` with
            ``targets_at(step)``.
    """
    datamodule = getattr(trainer, "datamodule", None)
    mixture = getattr(datamodule, "mix_control", None) or getattr(datamodule, "mixture", None)
    targets_at = getattr(mixture, "targets_at", None)
    return None if targets_at is None else targets_at(max(trainer.global_step - 1, 0))


def cache_metrics(trainer: pl.Trainer, distributed: bool) -> dict[str, float]:
    """``cache/<source>/<metric>`` of the train stores read through the nodes' shard caches
    (:data:`~lightning_tune_data.cache.cache_counters.CACHE_METRICS`, counted in every dataloader
    worker since ``setup``), summed over every rank (a collective when ``distributed``: every rank
    calls it at the same step); ``{}`` without such stores.

    Args:
        trainer: the trainer, whose datamodule's train sources are looked at.
        distributed: sum across the ranks.
    """
    datamodule = getattr(trainer, "datamodule", None)
    values: dict[str, float] = {}
    for name in getattr(datamodule, "train_source_weights", None) or {}:
        try:
            store = datamodule.dataset("train", name)
        except (AttributeError, KeyError, RuntimeError):
            continue
        if isinstance(store, CachedStore):
            values.update({f"cache/{name}/{metric}": value for metric, value in store.cache.counters.totals().items()})
    if distributed and dist.is_available() and dist.is_initialized():
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, values)
        values = {}
        for rank_values in gathered:
            for key, value in (rank_values or {}).items():
                values[key] = values.get(key, 0.0) + float(value)
    return values


def flatten_metrics(metrics: Mapping[str, Mapping[str, Any]], prefix: str = "dataset") -> dict[str, float]:
    """Flatten ``{name: {"metrics": {m: v}}}`` into ``{"<prefix>/<name>/<m>": v}`` (numeric values only).

    Args:
        metrics: ``{name: {"metrics": {metric: value}}}``.
        prefix: First path component of every key.
    """
    flat: dict[str, float] = {}
    for name, entry in metrics.items():
        for metric, value in entry.get("metrics", {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                flat[f"{prefix}/{name}/{metric}"] = value
    return flat


class DatasetMetricsCallback(Callback):
    """Log ``dataset/<name>/<metric>`` for every train source and the whole stream.

    * Reads ``batch["provenance"]`` of each train batch in ``on_train_batch_start`` and commits it in
      ``on_train_batch_end``, so only batches that were actually trained on count (a batch skipped by
      ``on_train_batch_start`` returning ``-1`` never reaches ``on_train_batch_end``). Batches without
      provenance are ignored.
    * Every ``log_every_n_steps`` optimizer steps (``trainer.global_step``) and at the end of
      training, reduces the metrics across ranks (a collective: it runs on every rank) and logs
      them on the same step as Lightning logs that batch's train loss (``global_step - 1``). When
      the Trainer logs at that step too (its ``log_every_n_steps`` divides this one) they go
      through ``LightningModule.log``, so a CSV logger writes them on the train loss's row.
    * ``window_share`` / ``window_token_share``: the mix over the last ``window`` batches, next to
      the cumulative ``share`` / ``token_share``; a changed weight shows within one window.
    * With a TensorBoard logger, a custom-scalars layout puts every source's shares on one chart.
    * At the end of a fit, rank 0 prints a short table of realised vs target mix, with notes that
      explain its numbers: sources whose documents reached the model with no target token, and
      how far documents held in open packs can keep the realised shares from the targets.
    * Target weights come from ``trainer.datamodule.train_source_weights`` when it exists.
    * With a mixture schedule (``trainer.datamodule.mixture``) or an online controller
      (``trainer.datamodule.mix_control``), ``mix/<name>/target`` logs the weight the stream draws
      by at the step next to the realised shares, and ``target_weight`` follows it.
    * Checkpoints hold every rank's counts (``{"world_size": W, "ranks": [...]}``); on resume each
      rank restores its own, so counters continue instead of restarting at 0. ``state_dict()`` is a
      collective under DDP, like Lightning's own ``trainer.save_checkpoint``: it must run on all ranks.

    Args:
        log_every_n_steps: Log every this many optimizer steps (``>= 1``).
        seq_len_stat_window_size: Per-rank window of recent sequence lengths per source.
        stream_name: Name of the whole-stream metrics group.
        collectors_factory: Optional factory ``name -> collector(s)``; defaults to
            :class:`StandardMetricCollector` with ``seq_len_stat_window_size``.
        window: Train batches the ``window_*`` shares cover (per rank).
        print_summary: Print the realised-vs-target table at the end of a fit.
    """

    def __init__(
        self,
        log_every_n_steps: int = 50,
        seq_len_stat_window_size: int = 1000,
        stream_name: str = "all",
        collectors_factory: CollectorsFactory | None = None,
        window: int = 100,
        print_summary: bool = True,
    ) -> None:
        if int(log_every_n_steps) < 1:
            raise ValueError(f"DatasetMetricsCallback: log_every_n_steps must be >= 1, got {log_every_n_steps}.")
        self.log_every_n_steps = int(log_every_n_steps)
        self.seq_len_stat_window_size = int(seq_len_stat_window_size)
        self.stream_name = stream_name
        factory = collectors_factory or functools.partial(
            StandardMetricCollector, seq_len_stat_window_size=self.seq_len_stat_window_size
        )
        self.window = int(window)
        self.print_summary = bool(print_summary)
        self.aggregator = DatasetMetricsAggregator(None, stream_name=stream_name, collectors_factory=factory,
                                                   window=self.window)
        self._pending: tuple[int, Mapping[str, Any], Mapping[str, Any]] | None = None
        self._last_metrics: MetricsDict = {}
        self._last_logged_step = -1
        self._logged_through_module = False

    @property
    def state_key(self) -> str:
        """Checkpoint key, unique per ``stream_name`` (several callbacks can coexist)."""
        return self._generate_state_key(stream_name=self.stream_name)

    # ------------------------------------------------------------------ hooks
    def _read_source_weights(self, trainer: pl.Trainer) -> None:
        """Take ``trainer.datamodule.train_source_weights`` as target weights when the datamodule has them.

        Args:
            trainer: The trainer.
        """
        weights = getattr(getattr(trainer, "datamodule", None), "train_source_weights", None)
        if weights:
            self.aggregator.set_source_weights(dict(weights))

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Read target weights when fitting (the datamodule's ``setup`` has run by now).

        Args:
            trainer: The trainer.
            pl_module: The module.
            stage: ``"fit"``, ``"validate"``, ``"test"`` or ``"predict"``.
        """
        if stage == "fit":
            self._read_source_weights(trainer)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Re-read target weights, in case the datamodule only knows them once loaders exist.

        Args:
            trainer: The trainer.
            pl_module: The module.
        """
        self._read_source_weights(trainer)
        self._pending = None
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                if isinstance(logger, TensorBoardLogger):
                    logger.experiment.add_custom_scalars(tensorboard_layout())

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Remember this batch's provenance; it counts once the batch was trained on.

        Args:
            trainer: The trainer.
            pl_module: The module.
            batch: The batch about to be trained on (already on the device).
            batch_idx: Index of the batch in the epoch.
        """
        self._pending = None
        self._forget_logged_values(trainer)
        if isinstance(batch, Mapping) and PROVENANCE in batch:
            self._pending = (batch_idx, batch[PROVENANCE], batch)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Count the trained batch, then log when an optimizer step lands on the logging interval.

        Args:
            trainer: The trainer.
            pl_module: The module.
            outputs: What ``training_step`` returned.
            batch: The batch that was trained on.
            batch_idx: Index of the batch in the epoch.
        """
        if self._pending is not None and self._pending[0] == batch_idx:
            _, provenance, start_batch = self._pending
            self.aggregator.update(provenance, start_batch)
        self._pending = None
        step = trainer.global_step
        if step > 0 and step % self.log_every_n_steps == 0 and step != self._last_logged_step:
            self._compute_and_log(trainer, pl_module)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Final reduction and log (skipped when the last step was just logged); runs on every rank.

        Args:
            trainer: The trainer.
            pl_module: The module.
        """
        if trainer.global_step != self._last_logged_step:
            self._compute_and_log(trainer)
        if self.print_summary and trainer.is_global_zero and self._last_metrics:
            datamodule = getattr(trainer, "datamodule", None)
            notes = mix_notes(self._last_metrics, self.stream_name, datamodule, trainer.world_size)
            print(format_mix_table(self._last_metrics, self.stream_name, getattr(datamodule, "mix_by", "documents"),
                                   notes), flush=True)

    def _forget_logged_values(self, trainer: pl.Trainer) -> None:
        """Stop Lightning from logging our last values again at later steps.

        Values given to ``LightningModule.log`` stay in the Trainer's results until the epoch ends and
        are logged again at every later logging step; dataset metrics must appear only at the steps
        they were computed for.
        """
        if not self._logged_through_module:
            return
        results = getattr(trainer, "_results", None)
        for item in getattr(results, "values", lambda: [])():
            meta = getattr(item, "meta", None)
            if getattr(meta, "fx", None) == "on_train_batch_end" and str(getattr(meta, "name", "")).startswith(("dataset/", "mix/")):
                item.reset()
        self._logged_through_module = False

    def _compute_and_log(self, trainer: pl.Trainer, pl_module: pl.LightningModule | None = None) -> None:
        """Reduce across ranks (collective: every rank calls this at the same step) and log.

        Args:
            trainer: The trainer.
            pl_module: The module, when called from a hook where ``LightningModule.log`` is allowed.
        """
        distributed = trainer.world_size > 1
        targets = scheduled_targets(trainer)
        if targets:  # a mixture schedule: the target follows the run
            self.aggregator.set_source_weights(targets)
        self._last_metrics = self.aggregator.compute(distributed=distributed)
        self._last_logged_step = trainer.global_step
        flat = flatten_metrics(self._last_metrics)
        flat.update({f"mix/{name}/target": float(weight) for name, weight in (targets or {}).items()})
        flat.update(cache_metrics(trainer, distributed))
        connector = getattr(trainer, "_logger_connector", None)
        if pl_module is not None and trainer.loggers and bool(getattr(connector, "should_update_logs", False)):
            # Every rank holds the same global values; float64 keeps counters exact in the logs.
            values = {key: torch.tensor(value, dtype=torch.float64) for key, value in flat.items()}
            pl_module.log_dict(values, on_step=True, on_epoch=False, batch_size=1, add_dataloader_idx=False)
            self._logged_through_module = True
        elif trainer.is_global_zero:
            for logger in trainer.loggers:  # the row Lightning logs this batch's train loss on
                logger.log_metrics(flat, step=max(trainer.global_step - 1, 0))

    def get_metrics(self) -> MetricsDict:
        """The last computed metrics, ``{name: {"metrics": {...}}}`` (global across ranks; a copy)."""
        return copy.deepcopy(self._last_metrics)

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """``{"world_size": W, "ranks": [aggregator state of rank 0, ...]}``: gathered from every rank.

        Lightning calls this on every rank and writes rank 0's result, so under DDP this gathers
        (``all_gather_object``) and must be called on all ranks.
        """
        local = self.aggregator.state_dict()
        rank, world = current_rank_and_world_size()
        if world == 1:
            return {"world_size": 1, "ranks": [local]}
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, local)
        return {"world_size": world, "ranks": gathered}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore this rank's entry of a state written by :meth:`state_dict`.

        Args:
            state_dict: ``{"world_size": W, "ranks": [...]}``.
        """
        if "world_size" not in state_dict or "ranks" not in state_dict:
            raise KeyError(
                f"DatasetMetricsCallback: checkpoint state has keys {sorted(state_dict)}, expected "
                "'world_size' and 'ranks'; was it written by another version of the callback?"
            )
        rank, world = current_rank_and_world_size()
        saved_world = int(state_dict["world_size"])
        if len(state_dict["ranks"]) != saved_world:
            raise ValueError(
                f"DatasetMetricsCallback: the checkpoint's dataset metrics claim world_size={saved_world} but hold "
                f"{len(state_dict['ranks'])} rank states; the checkpoint is damaged."
            )
        if saved_world != world:
            # Every logged metric is a global reduction: rank 0 takes the fold of all old ranks, the rest start empty.
            if rank == 0:
                self.aggregator.load_state_dict(merge_rank_states(state_dict["ranks"]))
            self._pending = None
            return
        self.aggregator.load_state_dict(state_dict["ranks"][rank])
        self._pending = None
