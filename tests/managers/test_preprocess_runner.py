"""The preprocessing runner: errors that name the row and the error budget that skips failing rows."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from source_files import TEXTS, write_jsonl

from lightning_tune_data import LocalDatasetManager
from lightning_tune_data.cache.marker import is_valid_cache
from lightning_tune_data.keys import PREPROCESS_ERROR
from lightning_tune_data.managers.preprocess_runner import PreprocessRunner, drop_failed_rows
from lightning_tune_data.preprocess import PreprocessError, tokenize_prompt_completion, tokenize_text
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


def test_bad_row_error_names_the_global_row_and_column(tmp_path: Path) -> None:
    rows = [{"text": t} for t in TEXTS]
    rows[15] = {"text": None}
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    for num_proc in (None, 2):  # row 15 is past the probe and, with 2 processes, in shard 2
        manager = LocalDatasetManager(data_files=str(path), num_proc=num_proc)
        with pytest.raises(PreprocessError, match=r"bad\.jsonl.*row 15, column 'text': expected a string, got None"):
            manager.prepare_data(TOK, tmp_path / f"cache-{num_proc}")
        assert not is_valid_cache(manager.cache_dir_for(TOK, tmp_path / f"cache-{num_proc}"))


def runner(fn=tokenize_text, max_error_count: int = 0, **kwargs) -> PreprocessRunner:
    return PreprocessRunner(fn, "'fn'", TOK, kwargs, "source 'notes'", max_error_count=max_error_count)


def test_the_runner_keeps_only_the_token_columns_and_tags_rows_only_with_a_budget() -> None:
    batch = {"text": ["ab", "c"], "id": [1, 2]}
    assert runner()(batch, [0, 1]) == {"input_ids": [[256, 97, 98, 257], [256, 99, 257]]}
    tagged = runner(max_error_count=2)(batch, [0, 1])
    assert tagged[PREPROCESS_ERROR] == [None, None]


def test_the_runner_with_a_budget_retries_row_by_row_and_tags_the_failing_row() -> None:
    tagging = runner(max_error_count=1)
    result = tagging({"text": ["ok", None, "fine"]}, [10, 11, 12])
    assert result["input_ids"][1] == [] and result["input_ids"][0] == [256, 111, 107, 257]
    assert result[PREPROCESS_ERROR][0] is None and "row 11, column 'text'" in result[PREPROCESS_ERROR][1]
    assert tagging.local_errors == 1
    with pytest.raises(PreprocessError, match=r"more than max_error_count=1 rows failed preprocessing"):
        tagging({"text": [None]}, [13])


def test_the_runner_names_a_missing_column_and_the_keyword_argument_that_reads_it() -> None:
    with pytest.raises(PreprocessError, match=r"column 'body' not found.*Set preprocess_kwargs: \{text_column: "):
        runner(text_column="body")({"text": ["x"]}, [0])


def test_a_loss_mask_must_come_with_every_batch_and_match_the_ids() -> None:
    first = runner(tokenize_prompt_completion)({"prompt": ["a"], "completion": ["b"]}, [0])
    assert first["loss_mask"] == [[False, False, True, True]]

    def mask_for_the_first_batch_only(examples: dict, tokenizer: ByteTokenizer) -> dict:
        masked = examples["text"] == ["first"]
        return {"input_ids": [[1]], **({"loss_mask": [[True]]} if masked else {})}

    sometimes = runner(mask_for_the_first_batch_only)
    sometimes({"text": ["first"]}, [0])
    with pytest.raises(PreprocessError, match=r"returned 'loss_mask' for some batches but not others \(rows 1-1\)"):
        sometimes({"text": ["second"]}, [1])

    def ragged(examples: dict, tokenizer: ByteTokenizer) -> dict:
        return {"input_ids": [[1, 2]], "loss_mask": [[True]]}

    with pytest.raises(PreprocessError, match=r"lengths differ from 'input_ids'"):
        runner(ragged)({"text": ["x"]}, [0])


def test_drop_failed_rows_counts_over_the_whole_dataset_and_enforces_the_budget() -> None:
    mapped = datasets.Dataset.from_dict(
        {"input_ids": [[1], [], [2], []], PREPROCESS_ERROR: [None, "row 1 failed", None, "row 3 failed"]}
    )
    with pytest.warns(UserWarning, match=r"skipped 2 rows .*First failure: row 1 failed"):
        kept, skipped = drop_failed_rows(mapped, 2, "source 'notes'")
    assert (kept["input_ids"], skipped) == ([[1], [2]], 2)
    with pytest.raises(PreprocessError, match=r"2 rows failed preprocessing, more than max_error_count=1"):
        drop_failed_rows(mapped, 1, "source 'notes'")
    clean = datasets.Dataset.from_dict({"input_ids": [[1]], PREPROCESS_ERROR: [None]})
    assert drop_failed_rows(clean, 0, "source 'notes'") == (clean, 0)
