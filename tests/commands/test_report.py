"""``lightning-tune-data report``: from the quickstart config (offline), from a finished run's metrics.csv, and its errors."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import pytest
from conftest import assert_valid_png, make_texts, write_jsonl
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.loggers import CSVLogger

from lightning_tune_data import DatasetMetricsCallback, LocalDatasetManager, TextDataModule
from lightning_tune_data.cli import main as cli_main
from lightning_tune_data.commands.report import main
from lightning_tune_data.loading.known_warnings import KNOWN_THIRD_PARTY_WARNINGS
from lightning_tune_data.models import TinyCausalLM

REPO = Path(__file__).resolve().parents[2]
QUICKSTART_SOURCES = ("prose", "arithmetic", "reverse")
#: Messages of the warnings the quickstart report printed (filled by the fixture).
REPORT_WARNINGS: list[str] = []


@pytest.fixture(scope="module")
def quickstart_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report")
    previous = Path.cwd()
    os.chdir(REPO)  # the quickstart's data files are relative to the repository root
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            code = main(["--config", "configs/quickstart.yaml", "--batches", "6", "--output", str(out / "report"),
                         "--cache-dir", str(out / "cache")])
        REPORT_WARNINGS[:] = [str(w.message) for w in caught]
    finally:
        os.chdir(previous)
    assert code == 0
    return out / "report"


def test_report_on_the_quickstart_writes_valid_charts_naming_every_source(quickstart_report: Path) -> None:
    markdown = (quickstart_report / "report.md").read_text()
    pngs = sorted(p.name for p in quickstart_report.glob("*.png"))
    assert pngs == ["efficiency.png", "lengths.png", "mix.png", "truncation.png"]
    for name in pngs:
        assert_valid_png(quickstart_report / name)
        assert f"]({name})" in markdown, f"report.md shows {name}"
    for source in QUICKSTART_SOURCES:
        assert f"| `{source}` |" in markdown
    assert "6 train batches drawn" in markdown and "packing=best_fit" in markdown


def test_report_mix_table_gives_target_and_realised_shares(quickstart_report: Path) -> None:
    markdown = (quickstart_report / "report.md").read_text()
    row = next(line for line in markdown.splitlines() if line.startswith("| `prose` |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "60.0%"
    documents, tokens = (float(c.rstrip("%")) for c in cells[2:4])
    assert 40 < documents < 80 and tokens > documents, "prose documents are the long ones"
    assert cells[6] == "10.3%", "135 of 1,317 prose documents are longer than 256 tokens"


def test_report_previews_rows_with_document_boundaries(quickstart_report: Path) -> None:
    markdown = (quickstart_report / "report.md").read_text()
    preview = markdown.split("## Preview of rows")[1]
    assert len(re.findall(r"^batch 0, row [012]: \d+ document\(s\)", preview, flags=re.M)) == 3
    assert re.search(r"^\[doc 0 \| (prose|arithmetic|reverse) \| \d+ tokens\] <bos>", preview, flags=re.M)
    shown = set(re.findall(r"^\[doc \d+ \| (\w+) \|", preview, flags=re.M))
    assert shown == set(QUICKSTART_SOURCES), "every source is shown in at least one previewed row"


def test_report_prints_no_known_third_party_deprecation_warning(quickstart_report: Path) -> None:
    assert REPORT_WARNINGS, "the quickstart's expected overlong-documents warning is recorded"
    assert not [m for m in REPORT_WARNINGS if any(re.match(p, m) for p in KNOWN_THIRD_PARTY_WARNINGS)]


def test_report_from_a_finished_runs_metrics(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", make_texts(30, seed=1, prefix="A", max_words=6))
    write_jsonl(tmp_path / "b.jsonl", make_texts(30, seed=2, prefix="B", max_words=30))
    seed_everything(0)
    datamodule = TextDataModule(
        dataset_managers={"train": {"a": LocalDatasetManager(data_files=str(tmp_path / "a.jsonl"), weight=0.3),
                                    "b": LocalDatasetManager(data_files=str(tmp_path / "b.jsonl"), weight=0.7)}},
        max_seq_len=64, batch_size=4, seed=1, packing="greedy", cache_dir=str(tmp_path / "cache"),
    )
    model = TinyCausalLM(vocab_size=datamodule.vocab_size, max_seq_len=64, d_model=16, n_layers=1, n_heads=2)
    logger = CSVLogger(tmp_path, name="run", version=0)
    Trainer(accelerator="cpu", max_steps=6, logger=logger, log_every_n_steps=2,
            callbacks=[DatasetMetricsCallback(log_every_n_steps=2, print_summary=False)], limit_val_batches=0,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
            ).fit(model, datamodule=datamodule)
    out = tmp_path / "report"
    with pytest.raises(SystemExit) as exit_code:  # through the console script's dispatch
        cli_main(["report", "--metrics", str(Path(logger.log_dir) / "metrics.csv"), "--output", str(out)])
    assert exit_code.value.code == 0
    markdown = (out / "report.md").read_text()
    assert "| `a` | 30.0% |" in markdown and "| `b` | 70.0% |" in markdown
    for name in ("mix.png", "loss.png", "efficiency.png", "truncation.png"):
        assert_valid_png(out / name)
        assert f"]({name})" in markdown


def test_report_errors_name_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = tmp_path / "model_only.yaml"
    config.write_text("model:\n  class_path: lightning_tune_data.models.TinyCausalLM\n")
    assert main(["--config", str(config), "--output", str(tmp_path / "out")]) == 2
    assert "no 'data:' section" in capsys.readouterr().err
    config.write_text("data:\n  max_seq_len: 64\n  bogus_key: 3\n")
    assert main(["--config", str(config), "--output", str(tmp_path / "out")]) == 2
    assert "does not accept option 'bogus_key'" in capsys.readouterr().err
    empty = tmp_path / "metrics.csv"
    empty.write_text("step,train/loss\n0,1.0\n")
    assert main(["--metrics", str(empty), "--output", str(tmp_path / "out")]) == 2
    assert "no dataset/<source>/share column" in capsys.readouterr().err


def test_help_lists_both_inputs_and_a_missing_input_is_a_usage_error(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_code:
        main(["--help"])
    assert exit_code.value.code == 0
    usage = capsys.readouterr().out
    assert "--config" in usage and "--metrics" in usage and "--batches" in usage
    with pytest.raises(SystemExit) as exit_code:
        main(["--output", "somewhere"])
    assert exit_code.value.code == 2
    assert "one of the arguments --config --metrics is required" in capsys.readouterr().err



def test_report_on_the_packed_quickstart_explains_the_documents_held_in_open_packs(quickstart_report: Path) -> None:
    markdown = (quickstart_report / "report.md").read_text()
    # best_fit, 64 open packs of 256 tokens in each of the quickstart's 2 workers
    assert "> **Note:** best_fit packing holds documents in up to 64 open packs per worker until they fill: up to " \
           "32,768 tokens drawn from the sources but not trained on yet" in markdown
