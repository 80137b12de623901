"""A readable progress bar for step-bounded training on an infinite stream.

Lightning's bar counts epochs (``Epoch 0/-2`` when the run is bounded by ``max_steps``) and shows
full metric keys (``train/interleaved/loss``), which ``rich`` cuts at the column width. This bar
says ``train`` with the step count out of ``max_steps`` (``101/300`` after a resume from step 100),
its rate counts only the steps this run trained (not the restored ones), and it shows metrics
without the stage and train-stream prefix: ``loss``, ``lm/loss``, ``arithmetic/loss``.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.utilities.types import STEP_OUTPUT


class StepProgressBar(RichProgressBar):
    """``RichProgressBar`` that counts optimizer steps out of ``max_steps`` when the run ends there."""

    def _step_bounded(self) -> bool:
        trainer = self.trainer
        return trainer.max_steps is not None and trainer.max_steps > 0 and trainer.max_epochs in (None, -1)

    def _get_train_description(self, current_epoch: int) -> str:
        if self._step_bounded():
            description = "train"
            if len(self.validation_description) > len(description):
                description = f"{description:{len(self.validation_description)}}"
            return description
        return super()._get_train_description(current_epoch)

    def _start_at_restored_step(self) -> None:
        """Show ``global_step / max_steps`` from the start, without counting restored steps in the rate."""
        if self.progress is None or self.train_progress_bar_id is None or not self._step_bounded():
            return
        # reset() clears the task's speed samples: the rate starts with this run's first step.
        self.progress.reset(self.train_progress_bar_id, total=self.trainer.max_steps,
                            completed=self.trainer.global_step, visible=True)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Open the train bar at the step the run starts from (``global_step``, restored on resume).

        Args:
            trainer: the running Trainer.
            pl_module: the model being trained.
        """
        super().on_train_epoch_start(trainer, pl_module)
        self._start_at_restored_step()

    def _initialize_train_progress_bar_id(self) -> None:
        super()._initialize_train_progress_bar_id()
        self._start_at_restored_step()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: STEP_OUTPUT, batch: Any, batch_idx: int
    ) -> None:
        """Advance the bar to ``global_step`` (a step-bounded run), else to the batch index as Lightning does.

        Args:
            trainer: the running Trainer.
            pl_module: the model being trained.
            outputs: the training step's outputs.
            batch: the batch just trained on.
            batch_idx: its index in the epoch.
        """
        if not self._step_bounded():
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
            return
        if not self.is_disabled and self.train_progress_bar_id is None:
            self._initialize_train_progress_bar_id()
        self._update(self.train_progress_bar_id, trainer.global_step)
        self._update_metrics(trainer, pl_module)
        self.refresh()

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        """The bar's metrics under short names (:func:`short_metric_name`), without the version number.

        Args:
            trainer: the running Trainer.
            pl_module: the model being trained.
        """
        metrics = super().get_metrics(trainer, pl_module)
        metrics.pop("v_num", None)
        return {short_metric_name(key): value for key, value in metrics.items()}


def short_metric_name(key: str) -> str:
    """``train/<stream>/loss`` -> ``loss``; ``val/lm/loss`` -> ``lm/loss``; other keys unchanged.

    Args:
        key: a logged metric's full name.
    """
    parts = key.split("/")
    if len(parts) == 3 and parts[0] == "train":
        return parts[2]
    if len(parts) == 3 and parts[0] in ("val", "test"):
        return "/".join(parts[1:])
    return key
