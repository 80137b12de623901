"""Checks a stage makes before it runs: that its split has data, that validation can happen, which stage runs."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn

from lightning_tune_data.datamodule.splits import SPLITS_FOR_STAGE


def check_stage(
    dataset_managers: dict[str, dict[str, Any]], stage: str | None, trainer: Any, infinite_stream: bool
) -> None:
    """The checks ``setup(stage)`` makes before it loads anything.

    Args:
        dataset_managers: ``{split: {name: manager}}``.
        stage: the Lightning stage about to run; ``None`` (every stage) or another name checks nothing.
        trainer: the datamodule's Trainer, or ``None``.
        infinite_stream: whether the train data is an infinite stream (no epoch end).

    Raises:
        ValueError: the stage's split has no manager for it (:func:`check_stage_has_data`).
    """
    if stage not in SPLITS_FOR_STAGE:
        return
    check_stage_has_data(dataset_managers, stage, SPLITS_FOR_STAGE[stage][0])
    if stage == "fit" and infinite_stream:
        warn_if_validation_never_runs(trainer, dataset_managers.get("val") or {})


def check_stage_has_data(dataset_managers: dict[str, dict[str, Any]], stage: str, split: str) -> None:
    """Raise a clear error when ``stage`` (fit/validate/test/predict) has no manager in ``split``.

    Args:
        dataset_managers: ``{split: {name: manager}}``.
        stage: the Lightning stage about to run.
        split: the split that stage reads first.

    Raises:
        ValueError: ``TextDataModule.dataset_managers.<split>: `<stage>` needs ...``, naming the
            splits the config does have.
    """
    if any(stage in manager.stages for manager in (dataset_managers.get(split) or {}).values()):
        return
    configured = sorted(name for name, managers in dataset_managers.items() if managers)
    raise ValueError(
        f"TextDataModule.dataset_managers.{split}: `{stage}` needs at least one {split} manager whose "
        f"stages include '{stage}', but this config has none (it configures {configured}). Add a "
        f"manager under dataset_managers.{split}, or run a stage this config has data for."
    )


def warn_if_validation_never_runs(trainer: Any, val_managers: dict[str, Any]) -> None:
    """Warn when val loaders exist but an infinite train stream never reaches the Trainer's check.

    An infinite stream has no epoch end, so ``val_check_interval`` as a fraction of an epoch (the
    Trainer's default ``1.0``) never triggers: validation would only run in the sanity check.

    Args:
        trainer: the datamodule's Trainer (``None``: nothing to check).
        val_managers: the val split's managers by name.
    """
    if trainer is None or not trainer.limit_val_batches:
        return
    if not any("fit" in manager.stages for manager in val_managers.values()):
        return
    if isinstance(trainer.val_check_interval, float):
        rank_zero_warn(
            f"The val split has loaders {list(val_managers)}, but the train stream is infinite, so an epoch "
            f"never ends and val_check_interval={trainer.val_check_interval} (a fraction of an epoch) never "
            "triggers: validation would only run in the sanity check. Set the Trainer's val_check_interval "
            "to a number of steps (e.g. 100) and check_val_every_n_epoch to None (YAML: "
            "`val_check_interval: 100`, `check_val_every_n_epoch: null`)."
        )


def trainer_is_evaluating(trainer: Any) -> bool:
    """Whether ``trainer`` runs validate/test/predict (a checkpoint's train position is then unused).

    Args:
        trainer: the datamodule's Trainer, or ``None``.
    """
    fn = getattr(getattr(trainer, "state", None), "fn", None)
    return fn is not None and fn != TrainerFn.FITTING
