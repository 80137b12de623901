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


def write_prompt_completion(path, prompt_lengths: list[int], seed: int = 0):
    """A prompt/completion JSONL: prompts of the given lengths in bytes (ByteTokenizer: one token each)."""
    import json
    import random

    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as handle:
        for n in prompt_lengths:
            prompt = "".join(rng.choice("abcdefgh ") for _ in range(n))
            handle.write(json.dumps({"prompt": prompt, "completion": " answer " + prompt[:3]}) + "\n")
    return path


def sft_datamodule(tmp_path, corpus_dir, prompt_lengths: list[int], **options) -> TextDataModule:
    """A 0.6 web / 0.4 sft mix, the sft source a prompt/completion file through the package's preprocess."""
    sft = write_prompt_completion(tmp_path / "sft.jsonl", prompt_lengths)
    return TextDataModule(
        {"train": {
            "web": LocalDatasetManager(data_files=str(corpus_dir / "a.jsonl"), weight=0.6),
            "sft": LocalDatasetManager(data_files=str(sft), weight=0.4, **options.pop("sft_options", {}),
                                       preprocess_function="lightning_tune_data.preprocess.tokenize_prompt_completion"),
        }},
        max_seq_len=12, batch_size=4, cache_dir=str(tmp_path / "cache"), **options)


def test_a_prompt_completion_source_whose_prompts_all_fill_max_seq_len_fails_at_setup(corpus_dir, tmp_path):
    # prompts of 13-34 bytes + BOS: 14-35 masked tokens, every completion cut away by max_seq_len=12
    datamodule = sft_datamodule(tmp_path, corpus_dir, [13 + i % 22 for i in range(60)])
    datamodule.prepare_data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match=r"Train source 'sft': none of its 60 documents has a target token within "
                                             r"max_seq_len=12.*Raise max_seq_len, shorten the prompts") as error:
            datamodule.setup("fit")
    assert "concat" not in str(error.value)
    overlong = [str(w.message) for w in caught if "'sft'" in str(w.message)]
    assert overlong and not any("concat" in line for line in overlong), "masked sources are never told to use concat"


@pytest.mark.parametrize("packing", [None, "greedy", "best_fit"])
def test_documents_left_without_a_target_are_warned_about_naming_the_source_the_count_and_the_fix(
        corpus_dir, tmp_path, packing):
    lengths = [2, 30, 4, 14, 25, 3, 40, 1, 20, 6] * 3  # 2-6 byte prompts keep a target within 12 tokens
    datamodule = sft_datamodule(tmp_path, corpus_dir, lengths, packing=packing)
    datamodule.prepare_data()
    without = sum(1 for n in lengths if n >= 11)  # BOS + n prompt bytes: a target within 12 tokens needs n + 1 <= 11
    with pytest.warns(UserWarning, match=rf"Train source 'sft': {without} of 30 documents \(50.0%\) have no target "
                                         r"token within max_seq_len=12.*overlong='drop'.*filter_fn") as caught:
        datamodule.setup("fit")
    assert not any("'web'" in str(w.message) and "target" in str(w.message) for w in caught)


def test_dropping_overlong_documents_leaves_no_target_free_document_to_warn_about(corpus_dir, tmp_path):
    datamodule = sft_datamodule(tmp_path, corpus_dir, [2, 30, 4, 14] * 5, overlong="drop")
    datamodule.prepare_data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        datamodule.setup("fit")
    assert not any("no target token" in str(w.message) for w in caught)


def keep_every_document(sample: dict) -> bool:
    """A stream filter (it could drop target-free documents: the setup check cannot know)."""
    return True


def test_a_source_with_stream_transforms_is_only_warned_about(corpus_dir, tmp_path):
    datamodule = sft_datamodule(tmp_path, corpus_dir, [20] * 10,
                                sft_options={"filter_fn": "test_stage_checks.keep_every_document"})
    datamodule.prepare_data()
    with pytest.warns(UserWarning, match=r"'sft': 10 of 10 documents .*before the source's stream transforms"):
        datamodule.setup("fit")
