"""Harness: Lightning's ``dataloader_idx`` -> the datamodule's dataloader name -> the metric group.

Everything runs through a real ``Trainer`` with a real ``TextDataModule`` whose val loaders are
named ``prose`` and ``sums`` (different data). The expected value of each logged metric is
recomputed by hand from that loader's batches, so a metric routed to the wrong loader fails.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torchmetrics
from conftest import make_texts, write_jsonl
from lightning.pytorch import Trainer, seed_everything

from lightning_tune_data import LocalDatasetManager, MetricSpec, TextDataModule
from lightning_tune_data.models import TinyCausalLM

VAL_NAMES = ["prose", "sums"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("harness")
    write_jsonl(root / "train.jsonl", make_texts(40, seed=1, prefix="T"))
    write_jsonl(root / "prose.jsonl", make_texts(9, seed=2, prefix="P"))
    write_jsonl(root / "sums.jsonl", [f"{i} + {3 * i} = {4 * i}" for i in range(11)])
    return root


def make_datamodule(data_dir: Path) -> TextDataModule:
    return TextDataModule(
        dataset_managers={
            "train": {"lm": LocalDatasetManager(data_files=str(data_dir / "train.jsonl"))},
            "val": {name: LocalDatasetManager(data_files=str(data_dir / f"{name}.jsonl")) for name in VAL_NAMES},
        },
        max_seq_len=64,
        batch_size=4,
        seed=0,
        cache_dir=str(data_dir / "cache"),
    )


def make_model(datamodule: TextDataModule, reported_metrics=None) -> TinyCausalLM:
    seed_everything(0)
    return TinyCausalLM(vocab_size=datamodule.vocab_size, max_seq_len=64, d_model=16, n_layers=1, n_heads=2,
                        reported_metrics=reported_metrics)


def make_trainer(root: Path, **overrides) -> Trainer:
    options = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                   enable_checkpointing=False, default_root_dir=root)
    options.update(overrides)
    return Trainer(**options)


def loss_group() -> dict[str, MetricSpec]:
    return {"loss": MetricSpec(torchmetrics.MeanMetric(), ["loss", "num_tokens"])}


def full_config(val: dict | None = None) -> dict:
    return {"train": {"lm": loss_group()}, "val": val if val is not None else {n: loss_group() for n in VAL_NAMES}}


@torch.no_grad()
def expected_val_losses(model: TinyCausalLM, datamodule: TextDataModule) -> dict[str, float]:
    """Token-weighted mean loss of every val loader, computed by hand, keyed by the loader's name."""
    model.eval()
    expected = {}
    for idx, loader in enumerate(datamodule.val_dataloader()):
        loss_sum, tokens = 0.0, 0
        for batch in loader:
            outputs = model.step_outputs(batch)
            loss_sum += float(outputs["loss"]) * int(outputs["num_tokens"])
            tokens += int(outputs["num_tokens"])
        expected[datamodule.dataloader_name("validate", idx)] = loss_sum / tokens
    return expected


def test_each_val_metric_is_logged_under_its_loaders_name_with_that_loaders_value(data_dir, tmp_path):
    datamodule = make_datamodule(data_dir)
    model = make_model(datamodule, full_config())
    trainer = make_trainer(tmp_path)

    results = trainer.validate(model, datamodule=datamodule, verbose=False)

    assert datamodule.dataloader_names["val"] == VAL_NAMES
    expected = expected_val_losses(model, datamodule)
    assert abs(expected["prose"] - expected["sums"]) > 1e-3, "the two val sets must give different losses"
    for idx, name in enumerate(VAL_NAMES):
        # trainer.validate returns one dict per dataloader_idx; each holds only its own loader's key.
        assert set(results[idx]) == {f"val/{name}/loss"}
        assert results[idx][f"val/{name}/loss"] == pytest.approx(expected[name], rel=1e-5)


def test_perplexity_on_logits_and_labels_equals_exp_of_the_token_weighted_loss(data_dir, tmp_path):
    datamodule = make_datamodule(data_dir)
    val = {
        "prose": {
            "loss": MetricSpec(torchmetrics.MeanMetric(), ["loss", "num_tokens"]),
            "perplexity": MetricSpec(torchmetrics.text.Perplexity(ignore_index=-100), ["logits", "labels"]),
        },
        "sums": loss_group(),
    }
    model = make_model(datamodule, full_config(val))

    trainer = make_trainer(tmp_path)
    trainer.validate(model, datamodule=datamodule, verbose=False)

    metrics = trainer.callback_metrics
    assert "val/sums/perplexity" not in metrics
    assert float(metrics["val/prose/perplexity"]) == pytest.approx(math.exp(float(metrics["val/prose/loss"])), rel=1e-4)
    assert float(metrics["val/prose/loss"]) == pytest.approx(expected_val_losses(model, datamodule)["prose"], rel=1e-5)


def test_val_dataloader_without_a_metric_group_fails_at_setup_naming_it_and_the_fix(data_dir, tmp_path):
    datamodule = make_datamodule(data_dir)
    model = make_model(datamodule, full_config({"prose": loss_group()}))
    with pytest.raises(ValueError, match=r"val dataloader\(s\) \['sums'\] have no metric group") as error:
        make_trainer(tmp_path).validate(model, datamodule=datamodule, verbose=False)
    assert "reported_metrics.val" in str(error.value)


def test_metric_group_for_a_name_no_dataloader_has_fails_naming_it(data_dir, tmp_path):
    datamodule = make_datamodule(data_dir)
    val = {n: loss_group() for n in VAL_NAMES} | {"prose_typo": loss_group()}
    model = make_model(datamodule, full_config(val))
    with pytest.raises(ValueError, match=r"reported_metrics.val names \['prose_typo'\]") as error:
        make_trainer(tmp_path).validate(model, datamodule=datamodule, verbose=False)
    assert "['prose', 'sums']" in str(error.value)


def test_without_reported_metrics_every_loader_gets_a_token_weighted_loss_group(data_dir, tmp_path):
    datamodule = make_datamodule(data_dir)
    model = make_model(datamodule, reported_metrics=None)
    trainer = make_trainer(tmp_path, max_steps=2, val_check_interval=2, check_val_every_n_epoch=None,
                           log_every_n_steps=1)

    trainer.fit(model, datamodule=datamodule)

    assert set(model.metric_groups) == {"train::lm", "val::prose", "val::sums"}
    for group in model.metric_groups.values():
        assert list(group) == ["loss"] and isinstance(group["loss"], torchmetrics.MeanMetric)
    metrics = trainer.callback_metrics
    assert {"train/lm/loss", "val/prose/loss", "val/sums/loss"} <= set(metrics)
    expected = expected_val_losses(model, datamodule)  # the weights after the last step = at the val run
    for name in VAL_NAMES:
        assert float(metrics[f"val/{name}/loss"]) == pytest.approx(expected[name], rel=1e-5)


def test_metric_asking_for_a_missing_step_output_fails_naming_the_available_outputs(data_dir, tmp_path):
    datamodule = make_datamodule(data_dir)
    val = {"prose": {"accuracy": MetricSpec(torchmetrics.MeanMetric(), ["predictions"])}, "sums": loss_group()}
    model = make_model(datamodule, full_config(val))
    with pytest.raises(KeyError) as error:
        make_trainer(tmp_path).validate(model, datamodule=datamodule, verbose=False)
    message = str(error.value)
    assert "reported_metrics.val.prose.accuracy" in message and "['predictions']" in message
    assert "['labels', 'logits', 'loss', 'num_tokens', 'token_loss']" in message


def test_unknown_reported_metrics_stage_fails_naming_the_valid_stages(data_dir, tmp_path):
    datamodule = make_datamodule(data_dir)
    model = make_model(datamodule, full_config() | {"validation": {n: loss_group() for n in VAL_NAMES}})
    with pytest.raises(ValueError, match=r"unknown stage\(s\) \['validation'\].*\['train', 'val', 'test'\]"):
        make_trainer(tmp_path).validate(model, datamodule=datamodule, verbose=False)
