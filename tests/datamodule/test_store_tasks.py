"""``prepare_task`` / ``finalize_stores``: the Python entry points of multi-task store writing, on a
local cache_dir (the same against S3 and from separate processes: tests/suites/test_remote_store.py)."""

from __future__ import annotations

import json

import yaml
from conftest import make_texts, write_jsonl

from lightning_tune_data import (
    LocalDatasetManager,
    TextDataModule,
    UnconditionalGenerationDatasetManager,
    finalize_stores,
    prepare_task,
)
from lightning_tune_data.datamodule.store_tasks import stored_sources


def data_section(tmp_path, cache_dir) -> dict:
    data = write_jsonl(tmp_path / "notes.jsonl", make_texts(19, seed=5, prefix="S"))
    return {"max_seq_len": 32, "batch_size": 2, "cache_dir": str(cache_dir), "dataset_managers": {
        "train": {"notes": {"class_path": "lightning_tune_data.LocalDatasetManager",
                            "init_args": {"data_files": str(data)}}}}}


def test_a_yaml_path_a_mapping_and_a_datamodule_name_the_same_store_and_the_last_task_commits_it(tmp_path):
    cache = tmp_path / "cache"
    section = data_section(tmp_path, cache)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({"data": section}), encoding="utf-8")

    first = prepare_task(str(path), 0, 3)
    assert first == {"train/notes": "written (6 rows, 1 shards)"}
    assert prepare_task({"data": section}, 1, 3)["train/notes"] == "written (6 rows, 1 shards)"
    datamodule = TextDataModule({"train": {"notes": LocalDatasetManager(data_files=section["dataset_managers"][
        "train"]["notes"]["init_args"]["data_files"])}}, max_seq_len=32, batch_size=2, cache_dir=str(cache))
    assert prepare_task(datamodule, 2, 3) == {"train/notes": "written (7 rows, 1 shards), store committed"}
    assert finalize_stores({"data": section}) == {"train/notes": "committed before"}

    [store] = cache.glob("notes-*")
    assert json.loads((store / "_COMPLETE.json").read_text())["store"]["rows"] == 19
    datamodule.setup("fit")
    assert len(datamodule.dataset("train", "notes")) == 19


def test_streaming_and_generated_sources_have_no_store_to_prepare(tmp_path):
    data = write_jsonl(tmp_path / "notes.jsonl", make_texts(5, seed=6))
    datamodule = TextDataModule({
        "train": {"stored": LocalDatasetManager(data_files=str(data)),
                  "streamed": LocalDatasetManager(data_files=str(data), streaming=True)},
        "predict": {"generated": UnconditionalGenerationDatasetManager(num_examples=2)},
    }, max_seq_len=32, batch_size=2, cache_dir=str(tmp_path / "cache"))
    assert [label for label, _ in stored_sources(datamodule)] == ["train/stored"]
    assert prepare_task(datamodule, 0, 1) == {"train/stored": "written (5 rows, 1 shards), store committed"}
