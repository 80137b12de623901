"""DatasetMetricsCallback through real Lightning Trainers (single process and 2-rank gloo DDP)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from lightning_tune_data.metrics import DatasetMetricsAggregator, DatasetMetricsCallback

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "metrics_training.py"
_spec = importlib.util.spec_from_file_location("metrics_training", SCRIPT)
mt = importlib.util.module_from_spec(_spec)
sys.modules["metrics_training"] = mt
_spec.loader.exec_module(mt)

COUNTERS = ("samples_seen", "tokens_seen", "epochs_completed", "seq_len_window_size")
FLOATS = ("seq_len_mean", "seq_len_p50", "share", "token_share", "target_weight")
STREAM_FLOATS = ("padding_share", "packing_efficiency", "docs_per_pack")


def assert_logged_matches(logged: dict[str, float], expected: dict[str, dict[str, float]]) -> None:
    """Every expected metric is in the logged row under ``dataset/<name>/<metric>`` with the same value.

    Args:
        logged: One CSV row (metric key -> value).
        expected: Output of ``reference_metrics``.
    """
    for name, metrics in expected.items():
        for metric, value in metrics.items():
            key = f"dataset/{name}/{metric}"
            assert key in logged, f"{key} not logged; logged keys: {sorted(logged)}"
            if metric in COUNTERS:
                assert logged[key] == value, key
            else:
                assert logged[key] == pytest.approx(value, rel=1e-9), key


def fit_single(
    tmp: Path,
    max_steps: int,
    log_every_n_steps: int = 3,
    window: int = 8,
    ckpt_every: int | None = None,
    ckpt_path: str | None = None,
    packed: bool = True,
    **trainer_kwargs: Any,
) -> tuple[pl.Trainer, DatasetMetricsCallback, Any]:
    """Run one single-process fit with 2 dataloader workers and return trainer, callback, model.

    Args:
        tmp: Output directory (CSV logs in ``tmp/csv/version_0``).
        max_steps: Optimizer steps.
        log_every_n_steps: Callback logging interval.
        window: Callback window size.
        ckpt_every: Checkpoint interval, if any.
        ckpt_path: Checkpoint to resume from.
        packed: Packed batches (with ``document_ids``) or padded ones.
        trainer_kwargs: Overrides for the Trainer (``accumulate_grad_batches``, ``logger``).
    """
    trainer, cb = mt.build_trainer(
        tmp, max_steps, log_every_n_steps, window, ddp=False, ckpt_every=ckpt_every, **trainer_kwargs
    )
    dm = mt.ProvenanceDataModule(num_workers=2, packed=packed)
    model = mt.RecordingModule()
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return trainer, cb, model


def test_logged_counts_equal_provenance_of_batches_the_model_trained_on(tmp_path: Path) -> None:
    trainer, cb, model = fit_single(tmp_path, max_steps=7, log_every_n_steps=3, window=8)
    assert len(model.records) == 7
    dataset_rows = mt.read_dataset_rows(tmp_path / "csv" / "version_0" / "metrics.csv")
    assert sorted(dataset_rows) == [3, 6, 7]  # every 3 optimizer steps, plus train end
    weights = trainer.datamodule.train_source_weights
    for step in (3, 6, 7):
        expected = mt.reference_metrics([model.records[:step]], window=8, weights=weights)
        assert_logged_matches(dataset_rows[step], expected)
    final = mt.reference_metrics([model.records], window=8, weights=weights)
    metrics = cb.get_metrics()
    assert set(metrics) == {"all", "books", "code", "web"}
    assert metrics["all"]["metrics"]["samples_seen"] == final["all"]["samples_seen"]
    assert metrics["books"]["metrics"]["target_weight"] == pytest.approx(0.5)


def test_counts_follow_optimizer_steps_under_gradient_accumulation(tmp_path: Path) -> None:
    trainer, cb, model = fit_single(
        tmp_path, max_steps=4, log_every_n_steps=2, window=5, packed=False, accumulate_grad_batches=2
    )
    assert len(model.records) == 8
    dataset_rows = mt.read_dataset_rows(tmp_path / "csv" / "version_0" / "metrics.csv")
    assert sorted(dataset_rows) == [2, 4]
    weights = trainer.datamodule.train_source_weights
    assert_logged_matches(dataset_rows[2], mt.reference_metrics([model.records[:4]], window=5, weights=weights))
    assert_logged_matches(dataset_rows[4], mt.reference_metrics([model.records], window=5, weights=weights))
    assert "dataset/all/packing_efficiency" not in dataset_rows[4]  # padded, not packed, batches


def test_resume_from_checkpoint_continues_counters(tmp_path: Path) -> None:
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    _, cb1, model1 = fit_single(first_dir, max_steps=6, log_every_n_steps=2, window=6, ckpt_every=3)
    ckpt = first_dir / "ckpt" / "step=3.ckpt"
    assert ckpt.exists(), sorted(p.name for p in (first_dir / "ckpt").iterdir())

    saved = torch.load(ckpt, weights_only=True)
    state = saved["callbacks"][cb1.state_key]
    assert state["world_size"] == 1 and len(state["ranks"]) == 1
    at_step3 = mt.reference_metrics([model1.records[:3]], window=6)
    restored = DatasetMetricsAggregator(None)
    restored.load_state_dict(state["ranks"][0])
    got = restored.compute(distributed=False)
    for name in at_step3:
        for metric in ("samples_seen", "tokens_seen", "epochs_completed", "seq_len_p50"):
            assert got[name]["metrics"][metric] == at_step3[name][metric], (name, metric)

    _, cb2, model2 = fit_single(second_dir, max_steps=8, log_every_n_steps=2, window=6, ckpt_path=str(ckpt))
    assert len(model2.records) == 5  # steps 4..8
    rows = mt.read_dataset_rows(second_dir / "csv" / "version_0" / "metrics.csv")
    expected = mt.reference_metrics(
        [model1.records[:3] + model2.records], window=6, weights={"books": 0.5, "code": 0.25, "web": 0.25}
    )
    assert_logged_matches(rows[8], expected)
    assert cb2.get_metrics()["all"]["metrics"]["samples_seen"] == expected["all"]["samples_seen"]


def test_metrics_are_logged_to_tensorboard_and_csv_loggers(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = TensorBoardLogger(tmp_path, name="tb", version=0)
    csv_logger = CSVLogger(tmp_path, name="csv", version=0)
    trainer, _, model = fit_single(tmp_path, max_steps=4, log_every_n_steps=2, logger=[tb, csv_logger])
    expected = mt.reference_metrics([model.records], window=8)
    events = EventAccumulator(str(tmp_path / "tb" / "version_0"))
    events.Reload()
    scalars = events.Tags()["scalars"]
    samples = events.Scalars("dataset/all/samples_seen")
    assert [e.step for e in samples] == [1, 3], "the steps Lightning logs the train loss of steps 2 and 4 at"
    assert samples[-1].value == expected["all"]["samples_seen"]
    assert "dataset/web/seq_len_p95" in scalars
    csv_rows = mt.read_dataset_rows(tmp_path / "csv" / "version_0" / "metrics.csv")
    assert csv_rows[4]["dataset/all/tokens_seen"] == expected["all"]["tokens_seen"]


class SkippingModule(mt.RecordingModule):
    """Skips (does not train on) the batch with ``batch_idx == 2`` of the first epoch, via ``-1``."""

    skipped_batches = 0

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None:
        if self.current_epoch == 0 and batch_idx == 2:
            self.skipped_batches += 1
            return -1
        return None


def test_batch_skipped_by_on_train_batch_start_is_not_counted(tmp_path: Path) -> None:
    trainer, cb = mt.build_trainer(tmp_path, max_steps=4, log_every_n_steps=10, window=8, ddp=False, ckpt_every=None)
    model = SkippingModule()
    trainer.fit(model, datamodule=mt.ProvenanceDataModule(num_workers=0))
    assert model.skipped_batches == 1 and len(model.records) == 4
    expected = mt.reference_metrics([model.records], window=8)
    got = cb.get_metrics()
    for name in expected:
        assert got[name]["metrics"]["samples_seen"] == expected[name]["samples_seen"]
        assert got[name]["metrics"]["tokens_seen"] == expected[name]["tokens_seen"]


def _wait_for(paths: list[Path], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        if time.monotonic() > deadline:
            raise AssertionError(f"missing outputs: {[str(p) for p in paths if not p.exists()]}")
        time.sleep(0.2)


def _run_ddp(out_dir: Path, *args: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), str(out_dir), *args], capture_output=True, text=True, timeout=400
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]


@pytest.mark.slow
def test_ddp_logs_global_counters_and_union_window_percentiles_and_resumes_per_rank(tmp_path: Path) -> None:
    _run_ddp(tmp_path, "fit")
    fit_files = [tmp_path / f"fit_records_rank{r}.json" for r in (0, 1)] + [tmp_path / "fit_result.json"]
    _wait_for(fit_files)
    records = [json.loads(p.read_text()) for p in fit_files[:2]]
    result = json.loads(fit_files[2].read_text())
    assert result["world_size"] == 2 and [len(r) for r in records] == [5, 5]
    weights = result["source_weights"]

    dataset_rows = mt.read_dataset_rows(result["metrics_csv"])
    assert sorted(dataset_rows) == [2, 4, 5]
    for step in (2, 4, 5):
        expected = mt.reference_metrics([r[:step] for r in records], window=6, weights=weights)
        assert_logged_matches(dataset_rows[step], expected)
    # The ranks' length distributions differ, so a percentile of the union differs from an average
    # or sum of per-rank percentiles: check the logged p50 really is the union's median.
    per_rank = [mt.reference_metrics([r], window=6)["all"]["seq_len_p50"] for r in records]
    union_p50 = dataset_rows[5]["dataset/all/seq_len_p50"]
    assert union_p50 not in (sum(per_rank), sum(per_rank) / 2)
    assert result["get_metrics"]["all"]["metrics"]["samples_seen"] == dataset_rows[5]["dataset/all/samples_seen"]

    ckpt = next(p for p in result["checkpoints"] if Path(p).name == "step=2.ckpt")
    state = next(iter(torch.load(ckpt, weights_only=True)["callbacks"].values()))
    assert state["world_size"] == 2
    for rank in (0, 1):
        own = mt.reference_metrics([records[rank][:2]], window=6)["all"]
        assert state["ranks"][rank]["collectors"]["all"][0]["samples_seen"] == own["samples_seen"]
        assert state["ranks"][rank]["collectors"]["all"][0]["tokens_seen"] == own["tokens_seen"]

    _run_ddp(tmp_path, "resume", ckpt)
    resume_files = [tmp_path / f"resume_records_rank{r}.json" for r in (0, 1)] + [tmp_path / "resume_result.json"]
    _wait_for(resume_files)
    resumed = [json.loads(p.read_text()) for p in resume_files[:2]]
    assert [len(r) for r in resumed] == [5, 5]  # steps 3..7
    rows = mt.read_dataset_rows(json.loads(resume_files[2].read_text())["metrics_csv"])
    expected = mt.reference_metrics(
        [records[r][:2] + resumed[r] for r in (0, 1)], window=6, weights=weights
    )
    assert_logged_matches(rows[7], expected)
