"""Input files: resolving local paths and globs, and naming what is wrong in a data file."""

from __future__ import annotations

import os
from pathlib import Path

import datasets
import pyarrow as pa
import pytest

from lightning_tune_data.managers import DataSourceError
from lightning_tune_data.managers.input_files import InputFiles, first_invalid_row, resolve_local_files
from lightning_tune_data.preprocess import PreprocessError


def test_resolve_local_files_expands_globs_in_order_and_lists_what_is_missing(tmp_path: Path, monkeypatch) -> None:
    for name in ("b.jsonl", "a.jsonl"):
        (tmp_path / name).write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    files, missing = resolve_local_files(["*.jsonl", "gone.jsonl", "none-*.csv"], "data_files")
    assert files == [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]  # absolute, sorted
    assert missing == [str(tmp_path / "gone.jsonl"), str(tmp_path / "none-*.csv")]
    assert resolve_local_files(str(tmp_path / "a.jsonl"), "data_files") == ([str(tmp_path / "a.jsonl")], [])
    with pytest.raises(DataSourceError, match=r"LocalDatasetManager data_files: expected file paths, got 3"):
        resolve_local_files([3], "data_files")


def test_first_invalid_row_finds_the_value_that_fails_full_validation() -> None:
    good = pa.array(["a", "b", "c"])
    assert first_invalid_row(good) == 0  # nothing fails: the chunk's start
    offsets = pa.array([0, 1, 2, 3], type=pa.int32())
    broken = pa.StringArray.from_buffers(3, offsets.buffers()[1], pa.py_buffer(b"a\xffc"))
    assert first_invalid_row(broken) == 1


def test_problems_name_empty_files_bad_utf8_bad_json_and_differing_columns(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "latin.jsonl").write_bytes(b'{"text": "ok"}\n{"text": "caf\xe9"}\n')
    (tmp_path / "broken.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    (tmp_path / "list.jsonl").write_text('[1, 2]\n')
    paths = [str(tmp_path / n) for n in ("empty.jsonl", "latin.jsonl", "broken.jsonl")]
    problems = InputFiles(paths, "json", {}).problems()
    assert problems[0] == f"{tmp_path / 'empty.jsonl'} is empty (0 bytes)"
    assert problems[1] == (f"{tmp_path / 'latin.jsonl'} line 2: not valid UTF-8 (byte 0xe9 at column 14); "
                           "re-encode the file as UTF-8")
    assert problems[2].startswith(f"{tmp_path / 'broken.jsonl'} line 2: not valid JSON")
    assert InputFiles([str(tmp_path / "broken.jsonl")], "json", {}).problems(limit=0) == []
    # A JSON array file is read by datasets as a whole, not line by line.
    assert InputFiles([str(tmp_path / "list.jsonl")], "json", {}).problems() == []
    (tmp_path / "a.csv").write_text("text;id\nx;1\n")
    (tmp_path / "b.csv").write_text("body;id\ny;2\n")
    csv = InputFiles([str(tmp_path / "a.csv"), str(tmp_path / "b.csv")], "csv", {"delimiter": ";"})
    assert csv.problems() == ["the files have different columns (a.csv: ['text', 'id']; b.csv: ['body', 'id'])"]
    assert csv.problems_note() == f" Problems found in the data files: {csv.problems()[0]}."
    assert InputFiles([str(tmp_path / "a.csv")], "parquet", {}).problems_note() == ""


def test_empty_files_are_warned_about_and_invalid_arrow_data_names_row_and_column(tmp_path: Path) -> None:
    (tmp_path / "empty.txt").write_bytes(b"")
    files = InputFiles([str(tmp_path / "empty.txt")], "text", {})
    with pytest.warns(UserWarning, match=r"source 'notes': data file .*empty.txt is empty; it adds no rows"):
        files.warn_empty("source 'notes'")
    offsets = pa.array([0, 1, 2], type=pa.int32())
    broken = pa.StringArray.from_buffers(2, offsets.buffers()[1], pa.py_buffer(b"a\xff"))
    dataset = datasets.Dataset(pa.table({"text": pa.chunked_array([pa.array(["x", "y"]), broken])}))
    with pytest.raises(PreprocessError, match=r"source 'notes': row 3, column 'text' holds data that is not valid"):
        files.check_table(dataset, "source 'notes'")
    files.check_table(datasets.Dataset.from_dict({"text": ["fine"]}), "source 'notes'")
    assert os.path.getsize(tmp_path / "empty.txt") == 0
