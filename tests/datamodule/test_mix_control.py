"""Online mixing through a real Trainer: the logged weights are ODM's formula applied to the logged
losses, the controller's settings are checked, and the weights' delay is what the loader needs."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.loggers import CSVLogger
from online_models import LevelModel, online_datamodule, write_sources

from lightning_tune_data import DatasetMetricsCallback, OnlineDataMixing
from lightning_tune_data.datamodule.mix_control import MixControl, build_controller, weights_delay
from lightning_tune_data.mixing.online_mixing import MixController

NAMES = ("low", "high")


def rows_by_step(path: Path) -> dict[int, dict[str, float]]:
    """metrics.csv merged per step (the CSV logger writes one row per log call)."""
    merged: dict[int, dict[str, float]] = {}
    with path.open() as handle:
        for row in csv.DictReader(handle):
            values = {k: float(v) for k, v in row.items() if v not in ("", None) and k != "step"}
            merged.setdefault(int(row["step"]), {}).update(values)
    return merged


def replay_odm(losses: list[dict[str, float]], start: list[float], alpha: float = 0.9) -> list[list[float]]:
    """ODM's EXP3 written out from the paper's formulas (independently of the package's code)."""
    k = len(start)
    rewards, policy, out = [0.0] * k, list(start), []
    eps = [1.0 / k] + [min(1.0 / k, math.sqrt(math.log(k) / (k * t))) for t in range(1, len(losses) + 1)]
    for t, loss in enumerate(losses, start=1):
        rewards = [alpha * r + (1 - alpha) * loss[n] / p for r, n, p in zip(rewards, NAMES, policy)]
        exps = [math.exp(eps[t - 1] * r) for r in rewards]
        policy = [(1 - k * eps[t]) * e / sum(exps) + eps[t] for e in exps]
        out.append(policy)
    return out


def test_logged_weights_are_odm_of_the_logged_losses(tmp_path: Path) -> None:
    root = write_sources(tmp_path)
    seed_everything(0)
    datamodule = online_datamodule(root, mix_update_every=1)
    trainer = Trainer(accelerator="cpu", max_steps=14, logger=CSVLogger(tmp_path / "logs"), log_every_n_steps=1,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                      enable_checkpointing=False)
    trainer.fit(LevelModel(), datamodule=datamodule)
    rows = rows_by_step(Path(trainer.logger.log_dir) / "metrics.csv")
    updates = sorted(step for step, row in rows.items() if "mix/low/weight" in row)
    assert updates == list(range(0, 13))  # update at step s logs on the row of step s - 1
    losses = []
    for step in updates:  # every=1: the interval's loss is that step's logged per-source loss
        row = rows[step]
        for name in NAMES:
            assert row[f"mix/{name}/loss"] == pytest.approx(row[f"train/{name}/loss"], rel=1e-6)
        losses.append({name: row[f"mix/{name}/loss"] for name in NAMES})
    assert all(loss["high"] > 2 * loss["low"] for loss in losses)  # very different loss levels
    expected = replay_odm(losses, [0.5, 0.5])
    logged = [[rows[step][f"mix/{name}/weight"] for name in NAMES] for step in updates]
    for got, want in zip(logged, expected):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert logged[-1][1] > 0.55 > logged[-1][0]  # the high-loss source is sampled more
    history = [x for _, weights in datamodule.mix_control.history for x in weights]
    assert history == pytest.approx([x for weights in expected for x in weights], rel=1e-9)


def test_weights_apply_from_the_update_step_plus_the_delay(tmp_path: Path) -> None:
    """The realised mix follows the published weights from their position on: a controller that
    puts every draw on ``high`` from its first update makes every document from step 2 + delay on
    a ``high`` one, and keeps ``low`` before."""

    class AllHigh(MixController):
        def update(self, step, stats):  # noqa: ANN001, ANN201
            return {"low": 0.0, "high": 1.0}

    root = write_sources(tmp_path)
    seed_everything(0)
    datamodule = online_datamodule(root, mix_controller=AllHigh(), mix_update_every=2, num_workers=0)
    sources: list[list[str]] = []

    class Record(LevelModel):
        def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
            sources.append(list(batch["provenance"]["source"]))
            return super().training_step(batch, batch_idx)

    trainer = Trainer(accelerator="cpu", max_steps=12, logger=CSVLogger(tmp_path / "logs"), log_every_n_steps=1,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                      enable_checkpointing=False, callbacks=[DatasetMetricsCallback(log_every_n_steps=1)])
    trainer.fit(Record(), datamodule=datamodule)
    delay = datamodule.mix_control.delay
    assert delay == weights_delay(0, None, 1) == 3
    assert all(s == "high" for batch in sources[2 + delay:] for s in batch)
    assert any(s == "low" for batch in sources[: 2 + delay] for s in batch)
    rows = rows_by_step(Path(trainer.logger.log_dir) / "metrics.csv")  # the callback's target follows the weights
    assert [rows[step]["mix/high/target"] for step in range(12)] == [0.5] * (2 + delay) + [1.0] * (10 - delay)


def test_changing_mix_update_every_on_resume_is_refused(tmp_path: Path) -> None:
    control = MixControl(OnlineDataMixing(), 4, list(NAMES))
    state = control.state_dict()
    other = MixControl(OnlineDataMixing(), 5, list(NAMES))
    with pytest.raises(ValueError, match=r"mix_update_every is 5; set mix_update_every: 4 to resume"):
        other.load_state_dict(state)


def test_controller_settings_are_checked() -> None:
    assert isinstance(build_controller({"class_path": "lightning_tune_data.OnlineDataMixing",
                                        "init_args": {"alpha": 0.5}}), OnlineDataMixing)
    with pytest.raises(ValueError, match="has no update"):
        build_controller(object())
    with pytest.raises(ValueError, match="mix_update_every"):
        MixControl(OnlineDataMixing(), 0, list(NAMES))
    control = MixControl(OnlineDataMixing(), 2, list(NAMES))
    with pytest.raises(ValueError, match="return a weight for each train source"):
        control._checked({"low": 1.0})
    with pytest.raises(ValueError, match="finite, >= 0"):
        control._checked({"low": -1.0, "high": 1.0})
    assert control._checked({"low": 1.0, "high": 3.0}) == [0.25, 0.75]


def test_the_delay_covers_the_loaders_prefetch() -> None:
    assert weights_delay(2, 2, 1) == 9  # 2 workers x (2 requested + 1 in the making) + 2, plus one
    assert weights_delay(4, 2, 4) == 4
    assert weights_delay(0, None, 1, read_ahead_steps=2.5) == 5


def test_without_a_controller_nothing_of_online_mixing_runs(tmp_path: Path) -> None:
    root = write_sources(tmp_path)
    datamodule = online_datamodule(root, mix_controller=None, num_workers=0)
    datamodule.prepare_data()
    datamodule.setup("fit")
    assert datamodule.mix_control is None
    assert type(datamodule.build_train_stream()._schedule).__name__ == "DrawSchedule"  # the fixed-weight rule
    iterator = iter(datamodule.train_dataloader())
    next(iterator)
    assert "mix_control" not in datamodule.state_dict()


def test_with_a_schedule_the_controllers_weights_multiply_the_schedules(tmp_path: Path) -> None:
    class Fixed(MixController):
        def update(self, step, stats):  # noqa: ANN001, ANN201
            return {"low": 0.25, "high": 0.75}

    root = write_sources(tmp_path)
    seed_everything(0)
    schedule = {"unit": "steps", "interpolation": "step", "points": [
        {"at": 0, "weights": {"low": 0.5, "high": 0.5}}, {"at": 8, "weights": {"low": 0.9, "high": 0.1}}]}
    datamodule = online_datamodule(root, mix_controller=Fixed(), mix_update_every=2, num_workers=0,
                                   mix_schedule=schedule)
    trainer = Trainer(accelerator="cpu", max_steps=12, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=0, enable_checkpointing=False)
    trainer.fit(LevelModel(), datamodule=datamodule)
    control = datamodule.mix_control
    assert control.delay == 3
    assert control.targets_at(4) == pytest.approx({"low": 0.5, "high": 0.5})  # schedule only: no version applies yet
    assert control.targets_at(6) == pytest.approx({"low": 0.25, "high": 0.75})  # update 1 (step 2) from 2 + 3
    product = [0.9 * 0.25, 0.1 * 0.75]
    assert control.targets_at(9) == pytest.approx({"low": product[0] / sum(product), "high": product[1] / sum(product)})
