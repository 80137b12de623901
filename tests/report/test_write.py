"""write_batch_report and write_metrics_report: report.md and its charts from drawn batches or a run's metrics.csv."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from lightning_tune_data import ByteTokenizer
from lightning_tune_data.report.batches import BatchReport
from lightning_tune_data.report.write import read_metrics_csv, write_batch_report, write_metrics_report


def write_csv(path: Path, rows: list[dict]) -> Path:
    columns = sorted({key for row in rows for key in row})
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return path


def logged_rows(with_loss: bool = True, with_padding: bool = True) -> list[dict]:
    rows = []
    for step, a_share in ((1, 0.2), (3, 0.3)):
        row = {"step": step, "epoch": 0}
        for source, share, weight in (("a", a_share, 0.3), ("b", 1 - a_share, 0.7)):
            row |= {f"dataset/{source}/share": share, f"dataset/{source}/token_share": share / 2,
                    f"dataset/{source}/target_weight": weight, f"dataset/{source}/window_share": share,
                    f"dataset/{source}/window_token_share": share, f"dataset/{source}/samples_seen": 10 * step,
                    f"dataset/{source}/truncated_docs": step, f"dataset/{source}/dropped_docs": 0,
                    f"dataset/{source}/no_target_docs": 0 if source == "a" else 7}
        if with_padding:
            row["dataset/all/padding_share"] = 0.1 * step
        rows.append(row)
        if with_loss:
            rows.append({"step": step - 1, "train/a/loss": 2.0 / step, "train/b/loss": 3.0 / step,
                         "train/interleaved/loss": 2.5 / step})
    return rows


def test_read_metrics_csv_keeps_the_numeric_cells_of_each_row_in_file_order(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    path.write_text("step,train/loss,note\n0,1.5,warmup\n1,,x\n", encoding="utf-8")
    assert read_metrics_csv(path) == [{"step": 0.0, "train/loss": 1.5}, {"step": 1.0}]


def test_metrics_report_shows_the_last_logged_mix_and_charts_what_was_logged(tmp_path: Path) -> None:
    path = write_metrics_report(write_csv(tmp_path / "metrics.csv", logged_rows()), tmp_path / "out")
    assert path == tmp_path / "out" / "report.md"
    markdown = path.read_text(encoding="utf-8")
    assert "(last logged step 3)" in markdown
    assert "| `a` | 30.0% | 30.0% | 15.0% | 30.0% | 30.0% | 3 / 0 | 0 |" in markdown
    assert "| `b` | 70.0% | 70.0% | 35.0% | 70.0% | 70.0% | 3 / 0 | 7 |" in markdown
    assert "> **Note:** 'b': 7 of 30 documents trained on had no target token" in markdown
    assert "'a':" not in markdown
    for name in ("mix.png", "loss.png", "efficiency.png", "truncation.png"):
        assert (tmp_path / "out" / name).is_file() and f"]({name})" in markdown


def test_metrics_report_leaves_out_the_charts_of_what_was_not_logged(tmp_path: Path) -> None:
    rows = logged_rows(with_loss=False, with_padding=False)
    markdown = write_metrics_report(write_csv(tmp_path / "metrics.csv", rows), tmp_path / "out").read_text()
    assert sorted(p.name for p in (tmp_path / "out").glob("*.png")) == ["mix.png", "truncation.png"]
    assert "## Train loss by source" not in markdown and "## Padding and packing" not in markdown


def test_metrics_report_needs_the_dataset_metrics(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "metrics.csv", [{"step": 0, "train/loss": 1.0}])
    with pytest.raises(ValueError, match="no dataset/<source>/share column"):
        write_metrics_report(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_batch_report_tabulates_the_mix_lengths_and_truncation_and_previews_rows(tmp_path: Path) -> None:
    tokenizer = ByteTokenizer()
    ids = [tokenizer.bos_id, *tokenizer.encode("hello"), tokenizer.eos_id]
    report = BatchReport(
        sources=["a", "b"], targets={"a": 0.25, "b": 0.75}, mix_by="tokens", max_seq_len=6, packing=None,
        batch_size=2, doc_shares={"a": [0.5, 0.25], "b": [0.5, 0.75]}, token_shares={"a": [0.4, 0.2], "b": [0.6, 0.8]},
        real_fraction=[0.75, 0.85],
        metrics={"all": {"metrics": {"padding_share": 0.2}},
                 "a": {"metrics": {"share": 0.25, "token_share": 0.2, "target_weight": 0.25, "samples_seen": 1200,
                                   "tokens_seen": 5000, "truncated_docs": 1, "dropped_docs": 0}},
                 "b": {"metrics": {"share": 0.75, "token_share": 0.8, "target_weight": 0.75, "samples_seen": 3,
                                   "tokens_seen": 20}}},
        lengths={"a": np.array([3, 5, 7, 9]), "b": np.zeros(0, dtype=np.int64)},
        preview={"input_ids": [ids], "labels": [ids[1:] + [-100]], "attention_mask": [[1] * len(ids)],
                 "provenance": {"source": ["a"], "new_document": [True]}},
    )
    path = write_batch_report(report, tokenizer, tmp_path / "out", config="fit.yaml")
    markdown = path.read_text(encoding="utf-8")
    assert "2 train batches drawn from `fit.yaml` (no model, no training): batch_size=2, max_seq_len=6, " \
           "packing=none; weights are shares of **tokens**." in markdown
    assert "| `a` | 25.0% | 25.0% | 20.0% | 1,200 | 5,000 | 50.0% | 1 / 0 | 0 |" in markdown
    assert "| `b` | 75.0% | 75.0% | 80.0% | 3 | 20 | - | 0 / 0 | 0 |" in markdown, "no cached lengths: unknown"
    assert "**Note:**" not in markdown, "nothing to explain: no target-free documents, no packing"
    assert "- real tokens / positions: 80.0%" in markdown and "- one document per row" in markdown
    assert "```text\nrow 0: 1 document(s), 7 tokens\n[doc 0 | a | 7 tokens] <bos>hello<eos>\n```" in markdown
    assert sorted(p.name for p in (tmp_path / "out").glob("*.png")) == [
        "efficiency.png", "lengths.png", "mix.png", "truncation.png"]


def test_metrics_report_charts_online_mixing_when_weights_were_logged(tmp_path: Path) -> None:
    rows = logged_rows() + [{"step": 1, "mix/a/weight": 0.4, "mix/b/weight": 0.6, "mix/a/loss": 1.0, "mix/b/loss": 3.0},
                            {"step": 3, "mix/a/weight": 0.3, "mix/b/weight": 0.7, "mix/a/loss": 0.9, "mix/b/loss": 2.9}]
    markdown = write_metrics_report(write_csv(tmp_path / "metrics.csv", rows), tmp_path / "out").read_text()
    assert "## Online mixing" in markdown and (tmp_path / "out" / "online_mixing.png").is_file()
    plain = write_metrics_report(write_csv(tmp_path / "plain.csv", logged_rows()), tmp_path / "plain").read_text()
    assert "## Online mixing" not in plain
