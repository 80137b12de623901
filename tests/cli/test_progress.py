"""The CLI's progress bar: steps out of max_steps for a step-bounded run (resumed too), short metric names."""

from __future__ import annotations

from unittest import mock

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, RichProgressBar
from lightning.pytorch.demos.boring_classes import BoringModel
from torch.utils.data import DataLoader, IterableDataset

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


class _RecordingBar(StepProgressBar):
    """The CLI's bar, recording what its train task shows after each step."""

    def __init__(self) -> None:
        super().__init__()
        self.shown: list[tuple[int, float, int]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        task = self.progress.tasks[self.train_progress_bar_id]
        # Rich's rate is the sum of the recorded advances (after the first sample) over their time.
        counted = sum(sample.completed for sample in task._progress)
        self.shown.append((int(task.completed), task.total, counted))


def _infinite_loader() -> DataLoader:
    class Endless(IterableDataset):
        def __iter__(self):
            while True:
                yield torch.randn(32)

    return DataLoader(Endless(), batch_size=2)


def test_resumed_progress_bar_counts_steps_of_max_steps_and_its_rate_only_this_runs_steps(tmp_path):
    first = Trainer(max_steps=4, logger=False, default_root_dir=str(tmp_path), enable_model_summary=False,
                    callbacks=[StepProgressBar(), ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4)])
    first.fit(BoringModel(), train_dataloaders=_infinite_loader())
    bar = _RecordingBar()
    resumed = Trainer(max_steps=7, logger=False, default_root_dir=str(tmp_path), enable_model_summary=False,
                      callbacks=[bar], enable_checkpointing=False)
    resumed.fit(BoringModel(), train_dataloaders=_infinite_loader(), ckpt_path=str(tmp_path / "epoch=0-step=4.ckpt"))

    assert [(completed, total) for completed, total, _ in bar.shown] == [(5, 7), (6, 7), (7, 7)]
    assert all(counted <= 3 for _, _, counted in bar.shown), "the 4 restored steps must not count in the rate"


def test_the_step_bar_needs_no_extra_the_quickstart_install_has_rich():
    """The quickstart installs the package without extras; the bar that reads ``train 300/300``
    is a ``RichProgressBar``, so ``rich`` must be a dependency of the package itself (without it
    the CLI falls back to Lightning's ``Epoch 0`` bar)."""
    import re
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    assert any(re.match(r"rich\s*>=", requirement) for requirement in project["dependencies"])
