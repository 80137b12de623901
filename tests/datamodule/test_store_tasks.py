"""Preparing a config's stores without training: every cached source, task by task, from a YAML
path, a mapping or a datamodule; streaming sources and generated prompts have no store."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import make_texts, write_jsonl

import lightning_tune_data
from lightning_tune_data.cache.tasks import StoreNotCommittedError
from lightning_tune_data.datamodule.store_tasks import finalize_stores, prepare_task, stored_sources


def config(tmp_path: Path) -> dict:
    files = {name: str(write_jsonl(tmp_path / f"{name}.jsonl", make_texts(30, seed=i, prefix=name)))
             for i, name in enumerate(["a", "b", "v"])}

    def local(path: str, **extra: object) -> dict:
        return {"class_path": "lightning_tune_data.LocalDatasetManager", "init_args": {"data_files": path, **extra}}

    return {"data": {
        "max_seq_len": 64, "batch_size": 4, "cache_dir": str(tmp_path / "cache"),
        "dataset_managers": {
            "train": {"a": local(files["a"]), "b": local(files["b"]), "s": local(files["a"], streaming=True)},
            "val": {"v": local(files["v"])},
            "predict": {"gen": {"class_path": "lightning_tune_data.UnconditionalGenerationDatasetManager",
                                "init_args": {"num_examples": 2}}},
        },
    }}


def test_every_stored_source_runs_its_task_and_the_last_task_commits(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    first = prepare_task(cfg, 0, 2)
    assert list(first) == ["train/a", "train/b", "val/v"]  # not the streaming source nor the prompts
    assert all(status.startswith("written") and "committed" not in status for status in first.values())
    with pytest.raises(StoreNotCommittedError, match="task 1 of 2"):
        finalize_stores(path)
    second = lightning_tune_data.prepare_task(str(path), 1, 2)
    assert all(", store committed at " in status for status in second.values())
    assert finalize_stores(cfg) == {"train/a": "committed before", "train/b": "committed before",
                                    "val/v": "committed before"}


def test_prepared_stores_are_what_fit_reads_without_rebuilding(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    from lightning_tune_data.report.batches import datamodule_from_config

    datamodule = datamodule_from_config(cfg)
    assert [label for label, _ in stored_sources(datamodule)] == ["train/a", "train/b", "val/v"]
    prepare_task(datamodule, 0, 1)
    folders = {label: m.cache_dir_for(datamodule.tokenizer, datamodule.store_root) for label, m in
               stored_sources(datamodule)}
    stamps = {label: (folder / "_COMPLETE.json").stat().st_mtime_ns for label, folder in folders.items()}
    datamodule.prepare_data()
    datamodule.setup("fit")
    assert {label: (folders[label] / "_COMPLETE.json").stat().st_mtime_ns for label in folders} == stamps
    assert next(iter(datamodule.train_dataloader()))["input_ids"].shape[0] == 4


def test_a_source_with_its_own_cache_dir_is_stored_there(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    cfg["data"]["dataset_managers"]["train"]["b"]["init_args"]["cache_dir"] = str(tmp_path / "elsewhere")
    prepare_task(cfg, 0, 1)
    stores = [p.name.split("-")[0] for p in (tmp_path / "elsewhere").iterdir() if (p / "_COMPLETE.json").is_file()]
    assert stores == ["b"]
    assert "b" not in {p.name.split("-")[0] for p in (tmp_path / "cache").iterdir()}
