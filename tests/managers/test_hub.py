"""DatasetManager: hub-style names, ``load_dataset`` builders with data files, local dataset folders."""

from __future__ import annotations

from pathlib import Path

import pytest
from source_files import TOK, TEXTS, expected_ids, jsonl, token_rows, write_jsonl  # noqa: F401 - fixtures

from lightning_tune_data.managers import DataSourceError, DatasetManager, parse_full_name


def test_dataset_manager_path_and_data_files_uses_load_dataset_directly(tmp_path: Path, jsonl: Path) -> None:
    manager = DatasetManager(path="json", data_files=str(jsonl), split="train")
    manager.prepare_data(TOK, tmp_path / "cache")
    assert token_rows(manager.setup(TOK, tmp_path / "cache")) == [expected_ids(t) for t in TEXTS]
    before = manager.fingerprint(TOK)
    write_jsonl(jsonl, [{"text": "edited"}])
    assert manager.fingerprint(TOK) != before  # local data files are part of the key here too


_README_WITH_CONFIGS = """---
configs:
- config_name: first
  data_files:
  - split: train
    path: first/*.jsonl
- config_name: second
  data_files:
  - split: train
    path: second/*.jsonl
---
"""


@pytest.fixture
def hub_like_folders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``acme/corpus`` (configs ``first``/``second``) and ``acme/plain`` as hub-style local folders.

    ``load_dataset("acme/corpus", ...)`` resolves a local folder of that name before the hub, so
    the real ``full_name`` code path runs offline.
    """
    corpus = tmp_path / "acme" / "corpus"
    for config, text in (("first", "one"), ("second", "two")):
        (corpus / config).mkdir(parents=True)
        write_jsonl(corpus / config / "train.jsonl", [{"text": text}])
    (corpus / "README.md").write_text(_README_WITH_CONFIGS)
    (tmp_path / "acme" / "plain").mkdir()
    write_jsonl(tmp_path / "acme" / "plain" / "train.jsonl", [{"text": "plain"}])
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_full_name_with_config_loads_that_config(hub_like_folders: Path) -> None:
    cache_dir = hub_like_folders / "cache"
    manager = DatasetManager(full_name="acme/corpus/second/train")
    assert manager.prepare_data(TOK, cache_dir).name.startswith("acme_corpus-second-train-")
    assert token_rows(manager.setup(TOK, cache_dir)) == [expected_ids("two")]
    plain = DatasetManager(full_name="acme/plain/train")
    plain.prepare_data(TOK, cache_dir)
    assert token_rows(plain.setup(TOK, cache_dir)) == [expected_ids("plain")]


def test_editing_a_local_dataset_folder_changes_the_fingerprint(hub_like_folders: Path) -> None:
    manager = DatasetManager(path="acme/plain", split="train")
    before = manager.fingerprint(TOK)
    write_jsonl(hub_like_folders / "acme" / "plain" / "train.jsonl", [{"text": "plain, but longer"}])
    assert manager.fingerprint(TOK) != before


def test_unknown_config_or_split_fails_naming_source_and_the_problem(hub_like_folders: Path) -> None:
    with pytest.raises(DataSourceError, match=r"source full_name='acme/corpus/third/train': datasets\.load_dataset failed.*'third' not found"):
        DatasetManager(full_name="acme/corpus/third/train").prepare_data(TOK, hub_like_folders / "cache")
    manager = DatasetManager(path="acme/plain", split="validation")
    with pytest.raises(DataSourceError, match=r"source path='acme/plain', split='validation': .*load_dataset failed.*validation"):
        manager.prepare_data(TOK, hub_like_folders / "cache")


@pytest.mark.parametrize(
    ("full_name", "expected"),
    [
        ("billion-word-benchmark/lm1b/train", ("billion-word-benchmark/lm1b", None, "train")),
        ("owner/dataset/config/test", ("owner/dataset", "config", "test")),
    ],
)
def test_full_name_parses_owner_dataset_optional_config_and_split(full_name: str, expected: tuple) -> None:
    assert parse_full_name(full_name) == expected
    manager = DatasetManager(full_name=full_name)
    assert (manager.path, manager.name, manager.split) == expected
    assert manager.source_description == f"source full_name={full_name!r}"


@pytest.mark.parametrize("full_name", ["lm1b/train", "a/b/c/d/e", "owner//train", ""])
def test_bad_full_name_explains_the_expected_format(full_name: str) -> None:
    with pytest.raises(DataSourceError, match=r"must be 'owner/dataset/split' or 'owner/dataset/config/split'"):
        DatasetManager(full_name=full_name)


def test_full_name_with_path_or_neither_is_rejected() -> None:
    with pytest.raises(DataSourceError, match=r"either full_name .* or path/name/split, not both"):
        DatasetManager(full_name="o/d/train", path="o/d")
    with pytest.raises(DataSourceError, match=r"set full_name .* or both path and split"):
        DatasetManager(path="o/d")


def test_hub_datasets_use_the_standard_hugging_face_cache_and_local_data_ours(tmp_path: Path, jsonl: Path) -> None:
    assert DatasetManager(full_name="owner/dataset/train")._download_cache_dir(tmp_path) is None
    local = DatasetManager(path="json", split="train", data_files=str(jsonl))
    assert local._download_cache_dir(tmp_path / "cache") == str(tmp_path / "cache" / "hf_datasets")
    local.prepare_data(TOK, tmp_path / "cache")
    assert not (tmp_path / "cache" / "hf_datasets").exists()  # the conversions went with the build's work folder
