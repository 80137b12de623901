"""Preprocessing: the preprocess function over a loaded dataset or a stream, pre-tokenized data, and its errors."""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pytest
from source_files import BOS, EOS, TEXTS, TOK, counting_tokenize, expected_ids, jsonl, token_rows, write_jsonl  # noqa: F401 - fixtures

from lightning_tune_data.managers import DataSourceError, LocalDatasetManager
from lightning_tune_data.preprocess import PreprocessError
from lightning_tune_data.tokenizers import ByteTokenizer


def test_pretokenized_data_needs_no_preprocess_function(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "ids.jsonl", [{"input_ids": [1, 2, 3], "meta": "x"}, {"input_ids": [4], "meta": "y"}])
    manager = LocalDatasetManager(data_files=str(path), preprocess_function=None)
    manager.prepare_data(TOK, tmp_path / "cache")
    dataset = manager.setup(TOK, tmp_path / "cache")
    assert dataset.column_names == ["input_ids"]
    assert token_rows(dataset) == [[1, 2, 3], [4]]


def test_partial_columns_to_remove_still_caches_only_token_columns(tmp_path: Path, jsonl: Path) -> None:
    manager = LocalDatasetManager(data_files=str(jsonl), columns_to_remove=["text"])
    manager.prepare_data(TOK, tmp_path / "cache")
    assert manager.setup(TOK, tmp_path / "cache").column_names == ["input_ids"]


def test_prompt_completion_manager_caches_loss_mask_false_on_prompt(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "sft.jsonl",
        [{"prompt": "2+2=", "completion": "4"}, {"prompt": "hi", "completion": "hello"}],
    )
    manager = LocalDatasetManager(
        data_files=str(path),
        preprocess_function="lightning_tune_data.preprocess.tokenize_prompt_completion",
    )
    manager.prepare_data(TOK, tmp_path / "cache")
    dataset = manager.setup(TOK, tmp_path / "cache").with_format("numpy")
    assert dataset.column_names == ["input_ids", "loss_mask"]
    first = dataset[0]
    assert first["input_ids"].tolist() == [BOS, *b"2+2=", *b"4", EOS]
    assert first["loss_mask"].dtype == np.bool_
    assert first["loss_mask"].tolist() == [False] * 5 + [True, True]
    assert int(dataset[1]["loss_mask"].sum()) == len("hello") + 1


def test_streaming_manager_skips_the_cache_and_tokenizes_lazily(tmp_path: Path, jsonl: Path) -> None:
    cache_dir = tmp_path / "cache"
    manager = LocalDatasetManager(data_files=str(jsonl), streaming=True)
    assert manager.prepare_data(TOK, cache_dir) is None
    assert not cache_dir.exists()  # nothing downloaded, tokenized or written
    stream = manager.setup(TOK, cache_dir)
    assert isinstance(stream, datasets.IterableDataset)
    rows = [row["input_ids"] for row in stream]
    assert rows == [expected_ids(t) for t in TEXTS]
    # _preprocess_error: None, or why the row failed (the streaming source skips and counts those)
    assert next(iter(stream)) == {"input_ids": expected_ids(TEXTS[0]), "_preprocess_error": None}


def test_streaming_prompt_completion_keeps_loss_mask(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "sft.jsonl", [{"prompt": "a", "completion": "b", "id": 0}])
    manager = LocalDatasetManager(
        data_files=str(path),
        streaming=True,
        preprocess_function="lightning_tune_data.preprocess.tokenize_prompt_completion",
    )
    (row,) = list(manager.setup(TOK, tmp_path / "cache"))
    assert row == {"input_ids": [BOS, 97, 98, EOS], "loss_mask": [False, False, True, True], "_preprocess_error": None}


def test_streaming_missing_column_fails_at_setup(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "wiki.jsonl", [{"body": "x", "id": 1}])
    manager = LocalDatasetManager(data_files=str(path), streaming=True)
    with pytest.raises(PreprocessError, match=r"column 'text' not found.*\['body', 'id'\]"):
        manager.setup(TOK, tmp_path / "cache")


def test_missing_column_error_names_source_available_columns_and_fix(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "wiki.jsonl", [{"body": "x", "id": 1}])
    manager = LocalDatasetManager(data_files=str(path))
    manager.source_name = "wiki"
    with pytest.raises(PreprocessError) as info:
        manager.prepare_data(TOK, tmp_path / "cache")
    message = str(info.value)
    assert message.startswith("source 'wiki' (json data_files=['wiki.jsonl']): column 'text' not found")
    assert "available columns: ['body', 'id']" in message
    assert "Set preprocess_kwargs: {text_column:" in message
    # A failed build leaves no cache and no temporary directory, only the lock file.
    assert [p.name for p in (tmp_path / "cache").iterdir() if p.name != "hf_datasets"] == [
        f"{manager.cache_dir_for(TOK, tmp_path / 'cache').name}.lock"
    ]


def test_missing_column_read_by_a_custom_function_suggests_its_kwarg(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "wiki.jsonl", [{"body": "x"}])
    manager = LocalDatasetManager(data_files=str(path), preprocess_function=counting_tokenize)
    with pytest.raises(PreprocessError, match=r"column 'text' not found.*\['body'\]\. Set preprocess_kwargs: \{text_column:"):
        manager.prepare_data(TOK, tmp_path / "cache")


def test_preprocess_function_returning_no_input_ids_is_rejected(tmp_path: Path, jsonl: Path) -> None:
    manager = LocalDatasetManager(data_files=str(jsonl), preprocess_function=returns_tokens_key)
    with pytest.raises(PreprocessError, match=r"returned \['tokens'\].*must return a dict with an 'input_ids'"):
        manager.prepare_data(TOK, tmp_path / "cache")


def returns_tokens_key(examples: dict[str, list], tokenizer: ByteTokenizer) -> dict[str, list]:
    return {"tokens": [[1] for _ in examples["text"]]}


def test_unknown_columns_to_remove_lists_available_columns(tmp_path: Path, jsonl: Path) -> None:
    manager = LocalDatasetManager(data_files=str(jsonl), columns_to_remove=["txt"])
    with pytest.raises(DataSourceError, match=r"columns_to_remove \['txt'\] not found; available columns: \['text', 'id'\]"):
        manager.prepare_data(TOK, tmp_path / "cache")


def test_pretokenized_mode_without_input_ids_says_to_set_preprocess_function(tmp_path: Path, jsonl: Path) -> None:
    manager = LocalDatasetManager(data_files=str(jsonl), preprocess_function=None)
    with pytest.raises(DataSourceError, match=r"must hold an 'input_ids' column; available columns: \['text', 'id'\]"):
        manager.prepare_data(TOK, tmp_path / "cache")
