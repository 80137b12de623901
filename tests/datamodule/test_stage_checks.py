"""Stage checks: a stage without data in its split fails naming it, a validation that can never run is
warned about, and whether the Trainer is evaluating (a checkpoint's train position then goes unused)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
from datamodule_config import managers
from lightning.pytorch.trainer.states import TrainerFn

from lightning_tune_data import LocalDatasetManager, TextDataModule
from lightning_tune_data.datamodule.stage_checks import (
    check_stage,
    check_stage_has_data,
    trainer_is_evaluating,
    warn_if_validation_never_runs,
)


def test_fit_without_train_managers_is_an_error_naming_the_split(corpus_dir, tmp_path):
    datamodule = TextDataModule(dataset_managers={"val": {"lm": LocalDatasetManager(data_files=str(corpus_dir / "val.jsonl"))}},
                                cache_dir=str(tmp_path / "cache"))
    assert datamodule.dataloader_names["train"] == []
    with pytest.raises(ValueError, match=r"dataset_managers.train: `fit` needs at least one train manager .*it configures \['val'\]"):
        datamodule.setup("fit")


@pytest.mark.parametrize(("stage", "split"), [("test", "test"), ("predict", "predict"), ("validate", "val")])
def test_stage_without_its_split_is_an_error_naming_the_split(corpus_dir, tmp_path, stage, split):
    datamodule = TextDataModule(dataset_managers={"train": managers(corpus_dir)["train"]}, cache_dir=str(tmp_path / "c"))
    with pytest.raises(ValueError, match=rf"dataset_managers.{split}: `{stage}` needs at least one {split} manager"):
        datamodule.setup(stage)


def test_a_split_whose_managers_skip_the_stage_has_no_data_for_it():
    held_out = SimpleNamespace(stages=["test"])
    check_stage_has_data({"test": {"held_out": held_out}}, "test", "test")
    with pytest.raises(ValueError, match=r"^TextDataModule.dataset_managers.test: `predict` needs at least one test "
                                         r"manager whose stages include 'predict', .*configures \['test'\]\)\. Add a manager"):
        check_stage_has_data({"test": {"held_out": held_out}, "val": {}}, "predict", "test")


def trainer(val_check_interval: float | int, limit_val_batches: float = 1.0) -> SimpleNamespace:
    return SimpleNamespace(val_check_interval=val_check_interval, limit_val_batches=limit_val_batches)


def test_validation_at_a_fraction_of_an_infinite_epoch_is_warned_about():
    val = {"lm": SimpleNamespace(stages=["fit", "validate"])}
    with pytest.warns(UserWarning, match=r"val split has loaders \['lm'\].*val_check_interval=1.0.*never triggers"):
        warn_if_validation_never_runs(trainer(1.0), val)


@pytest.mark.parametrize(
    ("run", "val"),
    [
        (trainer(100), {"lm": SimpleNamespace(stages=["fit"])}),  # a number of steps: validation runs
        (trainer(1.0, limit_val_batches=0), {"lm": SimpleNamespace(stages=["fit"])}),  # validation switched off
        (trainer(1.0), {"lm": SimpleNamespace(stages=["validate"])}),  # no val loader during fit
        (None, {"lm": SimpleNamespace(stages=["fit"])}),  # no Trainer
    ],
)
def test_validation_that_runs_or_is_not_asked_for_is_not_warned_about(run, val):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_if_validation_never_runs(run, val)


@pytest.mark.parametrize(
    ("fn", "evaluating"),
    [(TrainerFn.FITTING, False), (TrainerFn.VALIDATING, True), (TrainerFn.TESTING, True),
     (TrainerFn.PREDICTING, True), (None, False)],
)
def test_the_trainer_is_evaluating_in_validate_test_and_predict(fn, evaluating):
    assert trainer_is_evaluating(SimpleNamespace(state=SimpleNamespace(fn=fn))) is evaluating


def test_without_a_trainer_nothing_is_evaluating():
    assert trainer_is_evaluating(None) is False


def test_setups_checks_run_for_a_known_stage_and_warn_only_for_an_infinite_stream():
    config = {"train": {"a": SimpleNamespace(stages=["fit"])}, "val": {"lm": SimpleNamespace(stages=["fit"])}}
    with pytest.warns(UserWarning, match="the train stream is infinite"):
        check_stage(config, "fit", trainer(1.0), infinite_stream=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_stage(config, "fit", trainer(1.0), infinite_stream=False)
        check_stage({"val": {}}, None, trainer(1.0), infinite_stream=True)  # every stage: nothing to check first
    with pytest.raises(ValueError, match=r"dataset_managers.test: `test` needs at least one test manager"):
        check_stage(config, "test", None, infinite_stream=True)
