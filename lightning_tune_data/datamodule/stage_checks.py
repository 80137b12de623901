"""Checks a stage makes before it runs: that its split has data, that validation can happen, that
the train documents keep something to learn within ``max_seq_len``, which stage runs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn

from lightning_tune_data.datamodule.corpus_agreement import check_files_agree
from lightning_tune_data.datamodule.splits import SPLITS_FOR_STAGE
from lightning_tune_data.datamodule.train_stream import packing_splits_documents, warn_overlong_documents
from lightning_tune_data.sources.lengths import NoTargetSummary, no_target_summary


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


def check_train_documents(datasets: Mapping[str, Any], managers: Mapping[str, Any], max_seq_len: int,
                          overlong: str, packing: str | None) -> bool:
    """Warn about train documents the length policy cuts or drops, and about masked documents it
    leaves with no target token; fail when none of a source's documents keeps one.

    A prompt/completion document whose prompt fills ``max_seq_len`` keeps only masked tokens once
    cut: it takes its share of the mix and of the compute but adds nothing to the loss. Counted
    from the cached ``loss_mask`` columns in one vectorised pass per source.

    Args:
        datasets: the loaded train datasets by name.
        managers: the train managers by name (a source with stream transforms is only warned
            about: its transforms may change the documents after the cache).
        max_seq_len: the longest document a source hands out.
        overlong: ``"truncate"`` or ``"drop"``.
        packing: the packing strategy's name, or ``None``.

    First, under DDP, every rank's tokenized corpora must have the file identities rank 0
    recorded (:func:`~lightning_tune_data.datamodule.corpus_agreement.check_files_agree`).

    Returns:
        ``True``: the documents were checked (the datamodule then checks them only once).

    Raises:
        ValueError: every document of a source (without stream transforms) has no target token.
        DataSourceError: a rank opened a file of a tokenized corpus other than rank 0 did.
    """
    check_files_agree(dict(datasets))  # every rank reads the files rank 0 opened (a collective under DDP)
    warn_overlong_documents(datasets, max_seq_len, overlong, packing)
    cap = None if packing_splits_documents(packing) else max_seq_len
    for name, dataset in datasets.items():
        summary = no_target_summary(name, dataset, cap, overlong)  # type: ignore[arg-type]
        if summary is None or not summary.no_target:
            continue
        transformed = bool(getattr(getattr(managers.get(name), "options", None), "transforms", None))
        if summary.no_target == summary.documents and not transformed:
            raise ValueError(no_target_message(summary, overlong, everything=True))
        rank_zero_warn(no_target_message(summary, overlong, everything=False, transformed=transformed))
    return True


def no_target_message(summary: NoTargetSummary, overlong: str, everything: bool, transformed: bool = False) -> str:
    """The warning (or error) naming a source whose documents keep no target token, and the fix.

    Args:
        summary: what :func:`no_target_summary` counted.
        overlong: ``"truncate"`` or ``"drop"`` (with ``"truncate"``, dropping is one of the fixes).
        everything: whether no document of the source keeps a target (the error's wording).
        transformed: whether the source has stream transforms (they may change the count).
    """
    source, cap = summary.source, summary.max_seq_len
    cut = cap is not None and overlong == "truncate"
    where = f"within max_seq_len={cap}" if cut else "at all (every token after the first has loss_mask false)"
    if everything:
        head = f"Train source '{source}': none of its {summary.documents:,} documents has a target token {where}"
    else:
        head = (f"Train source '{source}': {summary.no_target:,} of {summary.documents:,} documents "
                f"({100 * summary.share:.1f}%) have no target token {where}")
    why = (", so the source would add nothing to the loss (its train loss would never be logged) while taking its "
           "share of the mix and of the compute." if everything else
           ", so they add nothing to the loss while taking their share of the mix and of the compute.")
    if cut:
        drop = "" if everything else "set overlong='drop' to skip documents longer than max_seq_len, "
        fix = (f" Truncation keeps each document's first {cap} tokens, here only masked prompt tokens. Raise "
               f"max_seq_len, shorten the prompts, {drop}or drop such documents with the manager's filter_fn.")
    else:
        fix = " Check the loss_mask the preprocess function writes, or drop such documents with the manager's filter_fn."
    note = " (Counted before the source's stream transforms, which may change this.)" if transformed else ""
    return head + why + fix + note


def trainer_is_evaluating(trainer: Any) -> bool:
    """Whether ``trainer`` runs validate/test/predict (a checkpoint's train position is then unused).

    Args:
        trainer: the datamodule's Trainer, or ``None``.
    """
    fn = getattr(getattr(trainer, "state", None), "fn", None)
    return fn is not None and fn != TrainerFn.FITTING
