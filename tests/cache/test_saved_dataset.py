"""The tokenized dataset in a cache folder and the manifest it is checked against when opened."""

from __future__ import annotations

import json
from pathlib import Path

import datasets

from lightning_tune_data.cache.saved_dataset import CACHE_MANIFEST, DATASET_FOLDER, open_dataset, save_dataset


def saved(folder: Path) -> Path:
    save_dataset(folder, datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4]]}), skipped_rows=2)
    return folder


def test_the_manifest_records_rows_skipped_rows_and_every_file_size(tmp_path: Path) -> None:
    manifest = json.loads((saved(tmp_path) / CACHE_MANIFEST).read_text())
    assert (manifest["num_rows"], manifest["skipped_rows"]) == (2, 2)
    assert manifest["files"] and all(name.startswith(f"{DATASET_FOLDER}/") for name in manifest["files"])
    for name, size in manifest["files"].items():
        assert (tmp_path / name).stat().st_size == size
    dataset, problem = open_dataset(tmp_path)
    assert problem is None and dataset["input_ids"] == [[1, 2, 3], [4]]


def test_opening_names_a_missing_or_truncated_file_and_an_unreadable_manifest(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    manifest = json.loads((folder / CACHE_MANIFEST).read_text())
    name = next(iter(manifest["files"]))
    (folder / name).write_bytes(b"short")
    assert open_dataset(folder) == (None, f"{name} has 5 bytes, {manifest['files'][name]} were written "
                                          f"(truncated or overwritten)")
    (folder / name).unlink()
    assert open_dataset(folder) == (None, f"{name} is missing")
    (folder / CACHE_MANIFEST).write_text("{broken")
    assert open_dataset(folder)[1].startswith(f"{CACHE_MANIFEST} is unreadable")


def test_a_cache_without_a_manifest_is_only_checked_by_opening_it(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    (folder / CACHE_MANIFEST).unlink()
    dataset, problem = open_dataset(folder)
    assert problem is None and len(dataset) == 2
    _, problem = open_dataset(tmp_path / "elsewhere")
    assert problem.startswith("the dataset does not open (FileNotFoundError")
