"""PredictionWriter and evaluation-only runs through a real Trainer: fit, then predict / validate /
test from the checkpoint with datamodules that hold no train manager."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_tune_data import (
    ByteTokenizer,
    LocalDatasetManager,
    PredictionWriter,
    TextDataModule,
    UnconditionalGenerationDatasetManager,
)
from lightning_tune_data.models import TinyCausalLM

from conftest import make_texts


def tiny_model(datamodule: TextDataModule) -> TinyCausalLM:
    return TinyCausalLM(vocab_size=datamodule.vocab_size, max_seq_len=datamodule.max_seq_len, d_model=16,
                        n_layers=1, n_heads=2, generate_tokens=5)


def trainer(tmp_path: Path, **kwargs) -> Trainer:
    return Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                   enable_model_summary=False, default_root_dir=str(tmp_path), **kwargs)


@pytest.fixture
def checkpoint(corpus_dir: Path, tmp_path: Path) -> Path:
    datamodule = TextDataModule({"train": {"a": LocalDatasetManager(data_files=str(corpus_dir / "a.jsonl"))}},
                                max_seq_len=64, batch_size=4, cache_dir=str(tmp_path / "cache"))
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3)
    trainer(tmp_path, max_steps=3, callbacks=[checkpoints]).fit(tiny_model(datamodule), datamodule=datamodule)
    return Path(checkpoints.best_model_path or checkpoints.last_model_path or next((tmp_path / "ckpt").iterdir()))


def test_predict_from_a_checkpoint_writes_decoded_text_per_sample_without_train_data(
    checkpoint: Path, corpus_dir: Path, tmp_path: Path
) -> None:
    datamodule = TextDataModule(
        {"predict": {"unconditional": UnconditionalGenerationDatasetManager(num_examples=5),
                     "prompts": LocalDatasetManager(data_files=str(corpus_dir / "val.jsonl"))}},
        max_seq_len=64, batch_size=2, cache_dir=str(tmp_path / "cache"),
    )
    output = tmp_path / "out" / "predictions.jsonl"
    run = trainer(tmp_path, callbacks=[PredictionWriter(str(output))])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run.predict(tiny_model(datamodule), datamodule=datamodule, ckpt_path=str(checkpoint), return_predictions=False)
    assert not [w for w in caught if "infer the batch indices" in str(w.message)]
    assert not [w for w in caught if "callbacks used to create the checkpoint" in str(w.message)], \
        "the fit's ModelCheckpoint is not needed to predict"

    lines = [json.loads(line) for line in output.read_text().splitlines()]
    assert [line["dataloader"] for line in lines] == ["unconditional"] * 5 + ["prompts"] * 13
    assert [line["index"] for line in lines] == list(range(5)) + list(range(13))
    tokenizer = ByteTokenizer()
    for line in lines[:5]:
        assert line["token_ids"][0] == tokenizer.bos_id and len(line["token_ids"]) == 1 + 5
        assert line["text"] == tokenizer.decode(line["token_ids"])
    assert lines[5]["text"][:40] == make_texts(13, seed=3, prefix="V")[0][:40]  # the prompt, then generated text


def test_validate_and_test_from_a_checkpoint_need_no_train_manager(checkpoint: Path, corpus_dir: Path, tmp_path: Path) -> None:
    val = LocalDatasetManager(data_files=str(corpus_dir / "val.jsonl"))
    datamodule = TextDataModule({"val": {"lm": val}, "test": {"lm": val}}, max_seq_len=64, batch_size=4,
                                cache_dir=str(tmp_path / "cache"))
    run = trainer(tmp_path)
    [validated] = run.validate(tiny_model(datamodule), datamodule=datamodule, ckpt_path=str(checkpoint))
    [tested] = run.test(tiny_model(datamodule), datamodule=datamodule, ckpt_path=str(checkpoint))
    assert torch.isfinite(torch.tensor(validated["val/lm/loss"]))
    assert validated["val/lm/loss"] == pytest.approx(tested["test/lm/loss"])


def test_prediction_writer_names_a_prediction_it_cannot_decode() -> None:
    from lightning_tune_data.models.prediction_writer import sample_token_ids

    assert sample_token_ids(torch.tensor([[256, 104], [256, 105]]), "x") == [[256, 104], [256, 105]]
    assert sample_token_ids([torch.tensor([1, 2]), (3,)], "x") == [[1, 2], [3]]
    with pytest.raises(ValueError, match=r"dataloader 'gen' returned a tensor of shape \(2,\)"):
        sample_token_ids(torch.tensor([1, 2]), "gen")
    with pytest.raises(ValueError, match=r"dataloader 'gen' returned dict"):
        sample_token_ids({"ids": [1]}, "gen")


def test_infinite_train_stream_with_default_val_check_interval_warns_that_validation_never_runs(
    corpus_dir: Path, tmp_path: Path
) -> None:
    datamodule = TextDataModule(
        {"train": {"a": LocalDatasetManager(data_files=str(corpus_dir / "a.jsonl"))},
         "val": {"lm": LocalDatasetManager(data_files=str(corpus_dir / "val.jsonl"))}},
        max_seq_len=64, batch_size=4, cache_dir=str(tmp_path / "cache"),
    )
    with pytest.warns(UserWarning, match=r"val_check_interval=1.0 .* never triggers.*val_check_interval: 100"):
        trainer(tmp_path, max_steps=2, num_sanity_val_steps=0).fit(tiny_model(datamodule), datamodule=datamodule)


def test_step_based_val_check_interval_runs_validation_without_a_warning(
    corpus_dir: Path, tmp_path: Path, recwarn: pytest.WarningsRecorder
) -> None:
    datamodule = TextDataModule(
        {"train": {"a": LocalDatasetManager(data_files=str(corpus_dir / "a.jsonl"))},
         "val": {"lm": LocalDatasetManager(data_files=str(corpus_dir / "val.jsonl"))}},
        max_seq_len=64, batch_size=4, cache_dir=str(tmp_path / "cache"),
    )
    run = trainer(tmp_path, max_steps=4, val_check_interval=2, check_val_every_n_epoch=None, num_sanity_val_steps=0)
    run.fit(tiny_model(datamodule), datamodule=datamodule)
    assert "val/lm/loss" in run.callback_metrics
    assert not [w for w in recwarn if "never triggers" in str(w.message)]


def test_fit_without_a_val_split_does_not_warn_about_empty_val_loaders(corpus_dir: Path, tmp_path: Path,
                                                                         recwarn: pytest.WarningsRecorder) -> None:
    datamodule = TextDataModule({"train": {"a": LocalDatasetManager(data_files=str(corpus_dir / "a.jsonl"))}},
                                max_seq_len=64, batch_size=4, cache_dir=str(tmp_path / "cache"))
    trainer(tmp_path, max_steps=2).fit(tiny_model(datamodule), datamodule=datamodule)
    assert not [w for w in recwarn if "across ranks is zero" in str(w.message)]
    assert not [w for w in recwarn if "never triggers" in str(w.message)]
