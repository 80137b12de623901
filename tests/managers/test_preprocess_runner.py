"""The preprocessing runner: errors that name the row and the error budget that skips failing rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_tune_data import LocalDatasetManager
from lightning_tune_data.preprocess import PreprocessError
from lightning_tune_data.tokenizers import ByteTokenizer

TOK = ByteTokenizer()


def failing_on_bad(examples: dict[str, list], tokenizer: ByteTokenizer) -> dict[str, list]:
    if any(text == "bad" for text in examples["text"]):
        raise RuntimeError("cannot handle 'bad'")
    return {"input_ids": [[tokenizer.bos_id, *tokenizer.encode(t), tokenizer.eos_id] for t in examples["text"]]}


def corpus(tmp_path: Path, texts: list) -> str:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return str(path)


def test_bad_row_error_offers_max_error_count(tmp_path: Path) -> None:
    manager = LocalDatasetManager(data_files=corpus(tmp_path, ["fine", None, "also fine"]))
    with pytest.raises(PreprocessError, match=r"row 1, column 'text'.*Fix or drop that row in the data, or set "
                                              r"max_error_count: N on this source to skip"):
        manager.prepare_data(TOK, tmp_path / "cache")


def test_failing_preprocess_function_error_offers_max_error_count(tmp_path: Path) -> None:
    manager = LocalDatasetManager(data_files=corpus(tmp_path, ["fine", "bad", "fine too"]),
                                  preprocess_function=f"{__name__}.failing_on_bad")
    with pytest.raises(PreprocessError, match=r"RuntimeError: cannot handle 'bad'\. To skip such rows, set "
                                              r"max_error_count: N on this source"):
        manager.prepare_data(TOK, tmp_path / "cache")


def test_with_a_budget_the_failing_row_is_skipped_and_the_hint_is_not_repeated(tmp_path: Path) -> None:
    manager = LocalDatasetManager(data_files=corpus(tmp_path, ["fine", "bad", "fine too"]), max_error_count=1,
                                  preprocess_function=f"{__name__}.failing_on_bad")
    with pytest.warns(UserWarning, match=r"skipped 1 rows") as caught:
        manager.prepare_data(TOK, tmp_path / "cache")
    assert "set max_error_count" not in str(caught[0].message)
    assert len(manager.setup(TOK, tmp_path / "cache")) == 2
