"""How the mix reaches people: CSV rows shared with the train loss, one TensorBoard chart, the end-of-fit table."""

from __future__ import annotations

import contextlib
import csv
import io
import re
from pathlib import Path

import pytest
from conftest import make_texts, write_jsonl
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from lightning_tune_data import DatasetMetricsCallback, LocalDatasetManager, TextDataModule
from lightning_tune_data.metrics.summary import format_mix_table, tensorboard_layout
from lightning_tune_data.models import TinyCausalLM


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("summary")
    write_jsonl(root / "short.jsonl", make_texts(40, seed=1, prefix="S", max_words=4))
    write_jsonl(root / "long.jsonl", make_texts(30, seed=2, prefix="L", min_words=10, max_words=30))
    seed_everything(0)
    datamodule = TextDataModule(
        dataset_managers={"train": {"short": LocalDatasetManager(data_files=str(root / "short.jsonl"), weight=0.7),
                                    "long": LocalDatasetManager(data_files=str(root / "long.jsonl"), weight=0.3)}},
        max_seq_len=64, batch_size=4, seed=1, packing="best_fit", cache_dir=str(root / "cache"),
    )
    model = TinyCausalLM(vocab_size=datamodule.vocab_size, max_seq_len=64, d_model=16, n_layers=1, n_heads=2)
    loggers = [CSVLogger(root, name="csv", version=0), TensorBoardLogger(root, name="tb", version=0)]
    callback = DatasetMetricsCallback(log_every_n_steps=2, window=3)
    trainer = Trainer(accelerator="cpu", max_steps=5, logger=loggers, callbacks=[callback], log_every_n_steps=2,
                      limit_val_batches=0, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        trainer.fit(model, datamodule=datamodule)
    with (root / "csv" / "version_0" / "metrics.csv").open(newline="") as handle:
        rows = [{k: v for k, v in row.items() if v} for row in csv.DictReader(handle)]
    return {"root": root, "rows": rows, "callback": callback, "printed": printed.getvalue()}


def test_csv_rows_hold_dataset_metrics_next_to_the_train_loss_of_that_step(fitted: dict) -> None:
    rows = fitted["rows"]
    dataset_rows = [r for r in rows if "dataset/all/samples_seen" in r]
    assert [int(r["step"]) for r in dataset_rows] == [1, 3, 4]  # optimizer steps 2 and 4 (every 2) and the end
    for row in dataset_rows[:2]:
        assert "train/interleaved/loss" in row, "the dataset metrics share the train loss's row"
        assert "train/short/loss" in row or "train/long/loss" in row
    assert len({int(r["step"]) for r in rows}) == len(rows), "one row per step"
    assert float(dataset_rows[1]["dataset/short/target_weight"]) == 0.7


def test_tensorboard_gets_one_chart_with_every_sources_share(fitted: dict) -> None:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.custom_scalar import layout_pb2

    layouts = []
    for path in (fitted["root"] / "tb" / "version_0").glob("events.out.tfevents.*"):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "custom_scalars":
                    layouts.append(layout_pb2.Layout.FromString(value.tensor.string_val[0]))
    assert len(layouts) == 1
    charts = {chart.title: list(chart.multiline.tag) for cat in layouts[0].category for chart in cat.chart}
    share = re.compile(charts["share of documents"][0])
    assert share.match("dataset/short/share") and share.match("dataset/long/share")
    assert not share.match("dataset/short/token_share") and not share.match("dataset/short/window_share")
    assert re.compile(charts["train loss"][0]).match("train/long/loss")


def test_end_of_fit_prints_realised_against_target_mix(fitted: dict) -> None:
    metrics = fitted["callback"].get_metrics()
    table = format_mix_table(metrics, "all", "documents")
    assert table in fitted["printed"]
    lines = table.splitlines()
    assert "shares of documents" in lines[0]
    assert lines[1].split()[:4] == ["source", "target", "documents", "tokens"]
    short = next(line for line in lines if line.startswith("short"))
    assert short.split()[1] == "70.0%"
    assert short.split()[2] == f"{100 * metrics['short']['metrics']['share']:.1f}%"
    assert "all" not in [line.split()[0] for line in lines[3:]]


def test_layout_charts_cover_shares_losses_and_truncation() -> None:
    layout = tensorboard_layout()
    assert set(layout) == {"Data mix", "Loss by source", "Length policy"}
    assert all(chart[0] == "Multiline" for group in layout.values() for chart in group.values())


def test_percentages_have_one_decimal_and_an_unknown_share_is_a_dash() -> None:
    from lightning_tune_data.metrics.summary import format_percent

    assert [format_percent(v) for v in (0.25, 1, 0.0004, None)] == ["25.0%", "100.0%", "0.0%", "-"]
    table = format_mix_table({"all": {"metrics": {}}, "a": {"metrics": {"share": 0.5}}})
    assert table.splitlines()[3].split() == ["a", "-", "50.0%", "-", "-", "-", "0", "0"]
