"""The build of a source's cache folder: load, preprocess, check the token ids, save with a manifest."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
from source_files import TEXTS, TOK, expected_ids

from lightning_tune_data.cache.shards import open_shards
from lightning_tune_data.managers.cache_build import CacheBuild, check_token_ids, progress_bars_off
from lightning_tune_data.managers.input_files import InputFiles
from lightning_tune_data.managers.options import SourceOptions
from lightning_tune_data.managers.preprocessing import Preprocessing
from lightning_tune_data.preprocess import PreprocessError


def keep_long_texts(examples: dict[str, list], tokenizer, min_length: int = 0) -> dict[str, list]:
    texts = [t for t in examples["text"] if len(t) >= min_length]
    return {"input_ids": [[tokenizer.bos_id, *tokenizer.encode(t), tokenizer.eos_id] for t in texts]}


def build(min_length: int = 0) -> CacheBuild:
    options = SourceOptions(preprocess_function=keep_long_texts, preprocess_kwargs={"min_length": min_length})
    raw = datasets.Dataset.from_dict({"text": TEXTS})
    return CacheBuild(lambda _work_dir: (raw, {"part": "all"}), Preprocessing(options, "source 'notes'"), lambda: InputFiles([], None, {}),
                      TOK, "f" * 64)


def test_a_build_fills_the_folder_with_its_shards_task_manifest_and_done_marker_and_removes_its_work(
    tmp_path: Path,
) -> None:
    manifest = build()(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards", "tasks"]
    assert sorted(p.name for p in (tmp_path / "tasks").iterdir()) == ["task-00000-of-00001.done",
                                                                      "task-00000-of-00001.json"]
    written = json.loads((tmp_path / "tasks" / "task-00000-of-00001.json").read_text())
    assert (written["rows_read"], written["skipped_rows"], written["columns"]) == (len(TEXTS), 0, ["input_ids"])
    assert written == manifest.as_json()
    assert sum(shard.tokens for shard in manifest.shards) == sum(len(expected_ids(t)) for t in TEXTS)
    saved = open_shards(tmp_path, [shard.path for shard in manifest.shards])
    assert saved.column_names == ["input_ids"] and saved["input_ids"] == [expected_ids(t) for t in TEXTS]


def test_a_build_that_keeps_no_rows_fails_naming_the_counts_and_the_function(tmp_path: Path) -> None:
    with pytest.raises(PreprocessError, match=r"source 'notes': no rows left after preprocessing \(20 rows read, 0 "
                                              r"skipped as failed\).*preprocess_function '.*keep_long_texts'"):
        build(min_length=1000)(tmp_path)


def test_check_token_ids_names_the_first_id_outside_the_vocabulary_and_its_row() -> None:
    rows = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3], [4, 300, 5]]})
    check_token_ids(rows, 301, TOK, "source 'notes'")
    with pytest.raises(PreprocessError, match=r"source 'notes': token id 300 \(row 2\) is outside the tokenizer's "
                                              r"vocabulary \(vocab_size=259, tokenizer ByteTokenizer\(\)\)"):
        check_token_ids(rows, 259, TOK, "source 'notes'")
    negative = datasets.Dataset.from_dict({"input_ids": [[1], [-2, 1]]})
    with pytest.raises(PreprocessError, match=r"token id -2 \(row 1\)"):
        check_token_ids(negative, 259, TOK, "source 'notes'")
    check_token_ids(datasets.Dataset.from_dict({"input_ids": [[], []]}), 259, TOK, "source 'notes'")


@pytest.mark.parametrize("enabled", [True, False])
def test_progress_bars_are_hidden_for_a_step_and_the_setting_restored(enabled: bool) -> None:
    datasets.enable_progress_bars() if enabled else datasets.disable_progress_bars()
    with progress_bars_off():
        assert not datasets.is_progress_bar_enabled()
    assert datasets.is_progress_bar_enabled() is enabled
    datasets.enable_progress_bars()
