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
    assert table.splitlines()[3].split() == ["a", "-", "50.0%", "-", "-", "-", "0", "0", "0"]


def test_the_table_counts_documents_without_a_target_and_says_what_they_cost() -> None:
    from lightning_tune_data.metrics.summary import no_target_notes

    metrics = {"all": {"metrics": {"samples_seen": 16}},
               "web": {"metrics": {"samples_seen": 10, "token_share": 0.625, "no_target_docs": 0}},
               "sft": {"metrics": {"samples_seen": 6, "token_share": 0.375, "no_target_docs": 6}}}
    notes = no_target_notes(metrics)
    assert notes == ["'sft': 6 of 6 documents trained on had no target token (every label masked, e.g. a prompt cut at "
                     "max_seq_len before its completion); they took 37.5% of the tokens and added nothing to the loss. "
                     "Raise max_seq_len or shorten the prompts."]
    lines = format_mix_table(metrics, notes=notes).splitlines()
    assert lines[1].split()[-2:] == ["no", "target"]
    assert lines[4].split()[0] == "sft" and lines[4].split()[-1] == "6"
    assert lines[-1] == f"Note: {notes[0]}"


def test_the_held_back_note_bounds_the_gap_by_the_tokens_open_packs_can_hold() -> None:
    from lightning_tune_data.metrics.summary import held_back_note

    note = held_back_note("best_fit", open_packs=64, max_seq_len=256, shards=2, tokens_seen=327_680)
    assert note.startswith("best_fit packing holds documents in up to 64 open packs per worker until they fill: up to "
                           "32,768 tokens drawn from the sources but not trained on yet, 10.0% of the 327,680 tokens")
    assert "one open pack per worker" in held_back_note("greedy", 1, 256, 1, 10_000)
    assert held_back_note("greedy", 1, 256, 1, 10_000_000) is None, "a gap under 0.05 points is not shown"
    assert held_back_note(None, 1, 256, 1, 100) is None


def test_the_end_of_fit_table_of_a_packed_fit_explains_the_documents_held_in_open_packs(fitted: dict) -> None:
    printed = fitted["printed"]
    tokens = fitted["callback"].get_metrics()["all"]["metrics"]["tokens_seen"]
    assert f"Note: best_fit packing holds documents in up to 64 open packs per worker until they fill: up to 4,096 " \
           f"tokens drawn from the sources but not trained on yet, {100 * 4096 / tokens:.1f}% of the {tokens:,}" in printed


def token_shares_by_batch(root: Path, packing: str, batches: int) -> tuple[list[dict[str, float]], list[int]]:
    """A 0.7 long / 0.3 short ``mix_by: tokens`` stream: per batch, the cumulative token shares trained on and
    the tokens trained on so far."""
    from lightning_tune_data.metrics.aggregator import DatasetMetricsAggregator

    if not (root / "long.jsonl").exists():
        write_jsonl(root / "long.jsonl", make_texts(300, seed=5, prefix="L", min_words=10, max_words=60))
        write_jsonl(root / "short.jsonl", make_texts(900, seed=6, prefix="S", max_words=3))
    datamodule = TextDataModule(
        dataset_managers={"train": {"long": LocalDatasetManager(data_files=str(root / "long.jsonl"), weight=0.7),
                                    "short": LocalDatasetManager(data_files=str(root / "short.jsonl"), weight=0.3)}},
        max_seq_len=128, batch_size=8, seed=0, packing=packing, mix_by="tokens", cache_dir=str(root / "cache"))
    datamodule.prepare_data()
    datamodule.setup("fit")
    aggregator = DatasetMetricsAggregator(datamodule.train_source_weights)
    shares, seen = [], []
    for index, batch in enumerate(datamodule.train_dataloader()):
        aggregator.update(batch["provenance"], batch)
        metrics = aggregator.compute(distributed=False)
        shares.append({name: metrics[name]["metrics"]["token_share"] for name in ("long", "short")})
        seen.append(metrics["all"]["metrics"]["tokens_seen"])
        if index + 1 == batches:
            return shares, seen
    raise AssertionError("the stream is infinite")


def test_best_fit_trained_on_token_shares_trail_the_targets_within_the_held_back_bound_then_converge(tmp_path):
    best_fit, seen = token_shares_by_batch(tmp_path, "best_fit", 150)
    held = 64 * 128  # packing_buffer_size open packs of max_seq_len tokens, one packer
    jitter = 0.02  # the mixer's own random jitter, at most 32 draws' worth
    gaps = [abs(shares["long"] - 0.7) for shares in best_fit]
    assert gaps[2] > 0.03, "early on, the documents waiting in open packs move the trained-on share off target"
    assert all(gap <= held / tokens + jitter for gap, tokens in zip(gaps, seen)), "the note's bound holds"
    assert gaps[-1] < gaps[29] / 3 and gaps[-1] < 0.04, "the gap shrinks as the trained-on tokens outnumber the held ones"
    greedy, _ = token_shares_by_batch(tmp_path, "greedy", 50)
    assert max(abs(shares["long"] - 0.7) for shares in greedy[29:]) < 0.01, "one open pack barely holds anything back"
