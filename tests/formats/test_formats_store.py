"""One of our committed stores read by its folder or URL, with no raw inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import make_texts, write_jsonl

from lightning_tune_data import LocalDatasetManager, TextDataModule, TokenizedDatasetManager
from lightning_tune_data.cache.mirror import upload_store
from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.cache.store_files import StoreFiles
from lightning_tune_data.managers import DataSourceError


def prepared_store(root: Path) -> tuple[Path, list[list[int]]]:
    """A store ``prepare_data`` committed, its raw input removed after; its folder and rows."""
    data = write_jsonl(root / "docs.jsonl", make_texts(40, seed=3))
    datamodule = TextDataModule({"train": {"web": LocalDatasetManager(data_files=str(data))}}, cache_dir=str(root / "c"),
                                shard_size="1KB")
    datamodule.prepare_data()
    datamodule.setup("fit")
    rows = [list(ids) for ids in datamodule.dataset("train", "web")["input_ids"]]
    data.unlink()
    [folder] = [marker.parent for marker in (root / "c").glob("web-*/_COMPLETE.json")]
    return folder, rows


def trained_rows(path: str, cache_dir: Path, **options) -> list[list[int]]:
    datamodule = TextDataModule({"train": {"web": TokenizedDatasetManager(path, **options)}}, cache_dir=str(cache_dir))
    datamodule.prepare_data()
    datamodule.setup("fit")
    data = datamodule.dataset("train", "web")
    return [list(ids) for ids in data["input_ids"]] if hasattr(data, "features") else None


def test_a_store_folder_is_read_with_no_raw_inputs(tmp_path: Path) -> None:
    folder, rows = prepared_store(tmp_path / "prep")
    assert trained_rows(str(folder), tmp_path / "elsewhere") == rows
    assert trained_rows(str(folder), tmp_path / "elsewhere", format="lightning_tune_data") == rows


def test_a_store_of_another_tokenizer_fails_naming_both(tmp_path: Path) -> None:
    folder, _ = prepared_store(tmp_path / "prep")
    marker = folder / "_COMPLETE.json"
    content = json.loads(marker.read_text())
    content["inputs"]["parts"]["tokenizer"] = "SentencePiece:llama-3"
    marker.write_text(json.dumps(content))
    with pytest.raises(DataSourceError, match=r"written with tokenizer 'SentencePiece:llama-3', but the datamodule's is "
                                              r"'ByteTokenizer:v1'"):
        trained_rows(str(folder), tmp_path / "elsewhere")


def test_a_store_on_s3_is_read_by_its_url(tmp_path: Path, s3) -> None:
    folder, rows = prepared_store(tmp_path / "prep")
    remote = StoreFiles(StoreRoot(s3.url, s3.storage_options), folder.name)
    upload_store(folder, remote, "source 'web'")
    url = f"{s3.url}/{folder.name}"
    assert trained_rows(url, tmp_path / "node", storage_options=s3.storage_options) == rows


def test_a_folder_that_is_not_a_committed_store_says_so(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="is not a committed store"):
        trained_rows(str(tmp_path / "empty"), tmp_path / "c", format="lightning_tune_data")


def test_a_store_on_s3_larger_than_the_cache_budget_is_read_shard_by_shard(tmp_path: Path, s3) -> None:
    from lightning_tune_data.cache.cached_store import CachedStore

    folder, rows = prepared_store(tmp_path / "prep")
    upload_store(folder, StoreFiles(StoreRoot(s3.url, s3.storage_options), folder.name), "source 'web'")
    datamodule = TextDataModule({"train": {"web": TokenizedDatasetManager(f"{s3.url}/{folder.name}")}},
                                cache_dir=s3.url, storage_options=s3.storage_options,
                                local_cache_dir=str(tmp_path / "node"), cache_budget="6KB", shuffle_window=1)
    datamodule.prepare_data()
    datamodule.setup("fit")
    store = datamodule.dataset("train", "web")
    assert isinstance(store, CachedStore) and store.num_shards > 2 and len(store) == len(rows)
    batch = next(iter(datamodule.train_dataloader()))
    assert batch["input_ids"].shape[0] == datamodule.batch_size
