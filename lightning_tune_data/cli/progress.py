"""A readable progress bar for step-bounded training on an infinite stream.

Lightning's bar counts epochs (``Epoch 0/-2`` when the run is bounded by ``max_steps``) and shows
full metric keys (``train/interleaved/loss``), which ``rich`` cuts at the column width. This bar
says ``train`` with the step count, and shows metrics without the stage and train-stream prefix:
``loss``, ``lm/loss``, ``arithmetic/loss``.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import RichProgressBar


class StepProgressBar(RichProgressBar):
    """``RichProgressBar`` that names steps, not epochs, when the run ends at ``max_steps``."""

    def _get_train_description(self, current_epoch: int) -> str:
        trainer = self.trainer
        if trainer.max_steps is not None and trainer.max_steps > 0 and trainer.max_epochs in (None, -1):
            description = "train"
            if len(self.validation_description) > len(description):
                description = f"{description:{len(self.validation_description)}}"
            return description
        return super()._get_train_description(current_epoch)

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
