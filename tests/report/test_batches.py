"""collect and datamodule_from_config: batches drawn from a configured train stream, and what they held."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_texts, write_jsonl

from lightning_tune_data import LocalDatasetManager, TextDataModule
from lightning_tune_data.report.batches import PREVIEW_KEYS, BatchReport, collect, datamodule_from_config


def two_sources(root: Path, packing: str | None) -> TextDataModule:
    write_jsonl(root / "a.jsonl", make_texts(30, seed=1, prefix="A", max_words=6))
    write_jsonl(root / "b.jsonl", make_texts(20, seed=2, prefix="B", min_words=20, max_words=40))
    return TextDataModule(
        dataset_managers={"train": {"a": LocalDatasetManager(data_files=str(root / "a.jsonl"), weight=3),
                                    "b": LocalDatasetManager(data_files=str(root / "b.jsonl"), weight=1)}},
        max_seq_len=256, batch_size=4, seed=1, packing=packing, num_workers=0, cache_dir=str(root / "cache"),
    )


def test_collect_follows_the_realised_mix_batch_by_batch(tmp_path: Path) -> None:
    report = collect(two_sources(tmp_path, packing=None), batches=5, preview_rows=2)
    assert isinstance(report, BatchReport) and report.batches == 5
    assert report.sources == ["a", "b"] and report.targets == {"a": 0.75, "b": 0.25}
    assert (report.mix_by, report.max_seq_len, report.packing, report.batch_size) == ("documents", 256, None, 4)
    assert [len(report.doc_shares[s]) for s in report.sources] == [5, 5]
    for index in range(5):
        assert report.doc_shares["a"][index] + report.doc_shares["b"][index] == pytest.approx(1.0)
        assert report.token_shares["a"][index] + report.token_shares["b"][index] == pytest.approx(1.0)
    metrics = report.metrics
    assert metrics["all"]["metrics"]["samples_seen"] == 20, "padded rows: one document per row"
    assert report.doc_shares["a"][-1] == pytest.approx(metrics["a"]["metrics"]["share"])
    assert report.token_shares["b"][-1] == pytest.approx(metrics["b"]["metrics"]["token_share"])
    assert all(0 < fraction <= 1 for fraction in report.real_fraction)
    assert [len(report.lengths[s]) for s in report.sources] == [30, 20]
    assert report.lengths["b"].min() > report.lengths["a"].max(), "b's documents are the long ones"


def test_the_preview_keeps_the_first_rows_and_their_documents_provenance(tmp_path: Path) -> None:
    report = collect(two_sources(tmp_path, packing="greedy"), batches=1, preview_rows=2)
    preview = report.preview
    assert set(PREVIEW_KEYS) - {"attention_mask"} <= set(preview) <= {*PREVIEW_KEYS, "provenance"}
    assert len(preview["input_ids"]) == len(preview["labels"]) == len(preview["document_ids"]) == 2
    assert preview["provenance"]["row"] and set(preview["provenance"]["row"]) <= {0, 1}
    documents_in_rows = sum(len(set(row) - {-1}) for row in preview["document_ids"])
    assert len(preview["provenance"]["source"]) == documents_in_rows
    assert report.metrics["all"]["metrics"]["docs_per_pack"] >= 1.0


def test_the_preview_adds_the_first_row_of_each_source_the_first_rows_do_not_show(tmp_path: Path) -> None:
    report = collect(two_sources(tmp_path, packing=None), batches=8, preview_rows=1)
    preview, origins = report.preview, report.preview_origin
    assert origins[0] == (0, 0) and len(origins) == 2, "one document per padded row: one more row for the other source"
    assert sorted(preview["provenance"]["source"]) == ["a", "b"]
    assert preview["provenance"]["row"] == [0, 1] and len(preview["input_ids"]) == 2
    first_source = preview["provenance"]["source"][0]
    assert origins[1] > (0, 0), f"the second row is the first drawn row that is not {first_source!r}"


def test_collect_needs_at_least_one_batch(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--batches must be >= 1, got 0"):
        collect(two_sources(tmp_path, packing=None), batches=0)


def test_datamodule_from_config_reads_the_data_section_as_the_cli_does(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", make_texts(5, seed=1))
    config = tmp_path / "fit.yaml"
    config.write_text(
        "model:\n  class_path: lightning_tune_data.models.TinyCausalLM\n"
        "data:\n  max_seq_len: 32\n  batch_size: 2\n  packing: greedy\n  cache_dir: ignored\n"
        "  dataset_managers:\n    train:\n      a:\n        class_path: lightning_tune_data.LocalDatasetManager\n"
        f"        init_args:\n          data_files: {tmp_path / 'a.jsonl'}\n          weight: 2\n"
    )
    datamodule = datamodule_from_config(config, cache_dir=str(tmp_path / "cache"))
    assert isinstance(datamodule, TextDataModule)
    assert (datamodule.max_seq_len, datamodule.batch_size, datamodule.packing) == (32, 2, "greedy")
    assert str(datamodule.cache_dir) == str(tmp_path / "cache")
    assert datamodule.train_source_weights == {"a": 1.0}
    config.write_text("trainer:\n  max_steps: 1\n")
    with pytest.raises(ValueError, match="no 'data:' section"):
        datamodule_from_config(config)
