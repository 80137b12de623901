"""The model side of named dataloaders: ``dataloader_idx`` -> name -> metric group.

The datamodule names every dataloader after its manager (``val: {lm: ..., arithmetic: ...}``);
the model configures one metric group per name (``reported_metrics: {val: {lm: {...}}}``).
During a step the :class:`Harness` resolves ``dataloader_idx`` to the name through the
datamodule and updates that name's torchmetrics, which are logged as
``<stage>/<name>/<metric>``. A dataloader name without a metric group (or a metric group
for a name no dataloader has) is an error at setup, never a silent no-op.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch
import torchmetrics
from lightning.pytorch import LightningModule

from lightning_tune_data.keys import INPUT_IDS, PROVENANCE
from lightning_tune_data.models.source_loss import split_loss_by_source

__all__ = ["METRIC_STAGES", "Harness", "MetricSpec", "ReportedMetrics", "default_metric_group"]

#: The stages ``reported_metrics`` configures metric groups for.
METRIC_STAGES = ("train", "val", "test")


@dataclass
class MetricSpec:
    """One reported metric.

    Args:
        metric: a torchmetrics metric (YAML: ``class_path``/``init_args``).
        inputs: names of step outputs passed positionally to ``metric.update`` — e.g.
            ``[loss, num_tokens]`` for a token-weighted ``MeanMetric``, ``[logits, labels]`` for
            ``torchmetrics.text.Perplexity``.
    """

    metric: torchmetrics.Metric
    inputs: list[str] = field(default_factory=lambda: ["loss", "num_tokens"])


#: ``{stage: {dataloader_name: {metric_name: MetricSpec}}}``.
ReportedMetrics = dict[str, dict[str, dict[str, MetricSpec]]]


def default_metric_group() -> dict[str, MetricSpec]:
    """The group used when ``reported_metrics`` is not given: token-weighted mean loss."""
    return {"loss": MetricSpec(torchmetrics.MeanMetric(), ["loss", "num_tokens"])}


class Harness(LightningModule, ABC):
    """Base LightningModule that routes each dataloader's outputs to its named metric group.

    Subclasses implement ``step_outputs(batch) -> dict`` (must hold ``loss``; whatever the
    configured ``inputs`` name) and get ``training_step``/``validation_step``/``test_step``.

    When ``step_outputs`` also returns ``token_loss`` (the unreduced ``[B, L]`` loss) and the
    train batch carries provenance, every training step logs ``train/<source>/loss`` for each
    train source with label tokens in the step: the token-weighted mean over that source's label
    tokens, summed over every DDP rank before dividing (so it is exact, not a mean of means).

    Args:
        reported_metrics: ``{stage: {dataloader_name: {metric_name: MetricSpec}}}`` with stage in
            train|val|test. ``None`` gives every dataloader a token-weighted ``loss`` group.
    """

    def __init__(self, reported_metrics: ReportedMetrics | None = None) -> None:
        super().__init__()
        self.reported_metrics_config = reported_metrics
        self.metric_groups = torch.nn.ModuleDict()
        self._metric_inputs: dict[str, dict[str, list[str]]] = {}

    # -- name <-> group -------------------------------------------------------------------
    @staticmethod
    def _key(stage: str, name: str) -> str:
        """The ``metric_groups`` key of dataloader ``name`` in ``stage``."""
        return f"{stage}::{name}"

    def _names_for(self, stage: str) -> list[str]:
        """The datamodule's dataloader names of ``stage``."""
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is None or not hasattr(datamodule, "dataloader_names"):
            raise RuntimeError(
                "Harness needs a datamodule with `dataloader_names` (e.g. TextDataModule) to name its dataloaders."
            )
        return list(datamodule.dataloader_names.get(stage, []))

    def dataloader_name(self, stage: str, dataloader_idx: int = 0) -> str:
        """The datamodule's name for dataloader ``dataloader_idx`` of ``stage``.

        Args:
            stage: ``"train"``, ``"val"``, ``"test"`` or ``"predict"``.
            dataloader_idx: Index of the dataloader, as Lightning passes it to a step.
        """
        return self.trainer.datamodule.dataloader_name(stage, dataloader_idx)

    def setup(self, stage: str) -> None:
        """Build and check the metric groups for the dataloaders this run will use.

        Args:
            stage: The Lightning stage being set up (every metric stage is checked whatever it is).

        Raises:
            ValueError: a stage is unknown, a dataloader has no metric group, or a group names no
                dataloader.
        """
        config = self.reported_metrics_config
        if config is not None:
            unknown = sorted(set(config) - set(METRIC_STAGES))
            if unknown:
                raise ValueError(f"reported_metrics: unknown stage(s) {unknown}; use {list(METRIC_STAGES)}.")
        for metric_stage in METRIC_STAGES:
            names = self._names_for(metric_stage)
            configured = None if config is None else (config.get(metric_stage) or {})
            if configured is not None:
                missing = [n for n in names if n not in configured]
                if missing:
                    raise ValueError(
                        f"{metric_stage} dataloader(s) {missing} have no metric group. Add them under "
                        f"reported_metrics.{metric_stage} (configured: {sorted(configured)})."
                    )
                extra = [n for n in configured if n not in names]
                if extra and names:
                    raise ValueError(
                        f"reported_metrics.{metric_stage} names {extra}, but the {metric_stage} dataloaders are "
                        f"{names}. Fix the name or remove the group."
                    )
            for name in names:
                key = self._key(metric_stage, name)
                if key in self.metric_groups:
                    continue
                group = default_metric_group() if configured is None else configured[name]
                self.metric_groups[key] = torch.nn.ModuleDict({m: spec.metric for m, spec in group.items()})
                self._metric_inputs[key] = {m: list(spec.inputs) for m, spec in group.items()}

    # -- steps ----------------------------------------------------------------------------
    @abstractmethod
    def step_outputs(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Compute the outputs metrics may consume; must include a scalar ``loss``.

        Args:
            batch: A batch of the datamodule's loaders.
        """

    def _update_and_log(self, stage: str, name: str, outputs: dict[str, Any], batch_size: int) -> None:
        """Update the metric group of dataloader ``name`` with its inputs and log each metric."""
        key = self._key(stage, name)
        on_step = stage == "train"
        for metric_name, metric in self.metric_groups[key].items():
            inputs = self._metric_inputs[key][metric_name]
            missing = [i for i in inputs if i not in outputs]
            if missing:
                raise KeyError(
                    f"reported_metrics.{stage}.{name}.{metric_name} asks for inputs {missing}; the model's "
                    f"step outputs are {sorted(outputs)}."
                )
            values = [outputs[i] for i in inputs]
            if on_step:
                metric(*values)  # forward: updates the state and caches this batch's value to log
            else:
                metric.update(*values)
            self.log(f"{stage}/{name}/{metric_name}", metric, on_step=on_step, on_epoch=not on_step,
                     batch_size=batch_size, add_dataloader_idx=False, prog_bar=metric_name == "loss")

    def _train_source_names(self) -> list[str]:
        """The datamodule's train source names (empty when it has no weights)."""
        weights = getattr(self.trainer.datamodule, "train_source_weights", None) or {}
        return list(weights)

    def _log_source_losses(self, stream: str, outputs: dict[str, Any], batch: dict[str, Any]) -> None:
        """Log ``train/<source>/loss`` from the per-token loss (sums reduced over ranks, then divided)."""
        token_loss = outputs.get("token_loss")
        if token_loss is None or PROVENANCE not in batch:
            return
        sources = self._train_source_names() or None
        split = split_loss_by_source(token_loss.detach(), batch, sources=sources)
        control = getattr(self.trainer.datamodule, "mix_control", None)
        if control is not None:  # online mixing: this rank's sums, reduced once per update
            control.observe(split, batch)
        if self.trainer.world_size > 1:
            split = split.all_reduce(self.trainer.strategy.reduce)
        means = split.means()
        self._forget_stale_source_losses({f"train/{source}/loss" for source in means})
        for source, loss in means.items():
            if source == stream:  # one train source: train/<name>/loss is already the overall loss
                continue
            self.log(f"train/{source}/loss", loss.float(), on_step=True, on_epoch=False, batch_size=1,
                     add_dataloader_idx=False)

    def _forget_stale_source_losses(self, logged_now: set[str]) -> None:
        """Drop the per-source losses of earlier steps that this step does not log.

        Lightning keeps a value logged with ``on_step=True`` and logs it again at later steps until it
        is logged anew; a source with no label token in this step must not show its old loss.
        """
        results = getattr(self.trainer, "_results", None)
        for item in getattr(results, "values", lambda: [])():
            meta = getattr(item, "meta", None)
            name = str(getattr(meta, "name", ""))
            if getattr(meta, "fx", None) == "training_step" and name.startswith("train/") and name.endswith("/loss") \
                    and name not in logged_now and name.count("/") == 2 and name.split("/")[1] in self._train_source_names():
                item.reset()

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        """Update and log the train metric group (and the per-source losses); return the loss to optimise.

        Args:
            batch: A train batch.
            batch_idx: Index of the batch in the epoch.
        """
        outputs = self.step_outputs(batch)
        stream = self.dataloader_name("train")
        self._update_and_log("train", stream, outputs, batch[INPUT_IDS].shape[0])
        self._log_source_losses(stream, outputs, batch)
        return outputs["loss"]

    def validation_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        """Update the metric group of the validation dataloader the batch comes from.

        Args:
            batch: A validation batch.
            batch_idx: Index of the batch in its dataloader.
            dataloader_idx: Index of the dataloader (resolved to its name).
        """
        outputs = self.step_outputs(batch)
        self._update_and_log("val", self.dataloader_name("val", dataloader_idx), outputs, batch[INPUT_IDS].shape[0])

    def test_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        """Update the metric group of the test dataloader the batch comes from.

        Args:
            batch: A test batch.
            batch_idx: Index of the batch in its dataloader.
            dataloader_idx: Index of the dataloader (resolved to its name).
        """
        outputs = self.step_outputs(batch)
        self._update_and_log("test", self.dataloader_name("test", dataloader_idx), outputs, batch[INPUT_IDS].shape[0])
