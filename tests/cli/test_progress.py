"""The CLI's progress bar: steps instead of epochs for a step-bounded run, short metric names."""

from __future__ import annotations

from unittest import mock

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import RichProgressBar

from lightning_tune_data.cli.progress import StepProgressBar, short_metric_name


def test_progress_bar_names_steps_and_short_metric_keys(tmp_path):
    assert short_metric_name("train/interleaved/loss") == "loss"
    assert short_metric_name("val/lm/perplexity") == "lm/perplexity"
    assert short_metric_name("dataset/all/padding_share") == "dataset/all/padding_share"
    bar = StepProgressBar()
    trainer = Trainer(max_steps=5, callbacks=[bar], logger=False, default_root_dir=str(tmp_path))
    bar.setup(trainer, None, "fit")
    assert bar._get_train_description(0).strip() == "train"
    epochs = StepProgressBar()
    epochs.setup(Trainer(max_epochs=2, callbacks=[epochs], logger=False, default_root_dir=str(tmp_path)), None, "fit")
    assert epochs._get_train_description(0).strip() == "Epoch 0/1"


def test_progress_bar_metrics_drop_the_version_and_use_short_names(tmp_path):
    bar = StepProgressBar()
    logged = {"train/interleaved/loss": 1.5, "val/lm/loss": 2.0, "v_num": 3, "lr": 0.1}
    with mock.patch.object(RichProgressBar, "get_metrics", return_value=dict(logged)):
        assert bar.get_metrics(None, None) == {"loss": 1.5, "lm/loss": 2.0, "lr": 0.1}
