"""Bad data: every case is either a clear error naming the file/row/field, or skipped and
counted under ``max_error_count``; never a silent wrong batch (issue 7, DESIGN decision 8)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import write_jsonl

from lightning_tune_data import ByteTokenizer, LocalDatasetManager, TextDataModule
from lightning_tune_data.cache.marker import COMPLETE_MARKER
from lightning_tune_data.managers import DataSourceError
from lightning_tune_data.preprocess import PreprocessError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

TOKENIZER = ByteTokenizer()


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def prepare(tmp_path: Path, files: list[Path], name: str = "src", **kwargs):
    """prepare_data + setup of one named manager; returns (manager, cached dataset)."""
    manager = LocalDatasetManager(data_files=[str(f) for f in files], **kwargs)
    manager.source_name = name
    manager.prepare_data(TOKENIZER, tmp_path / "cache")
    return manager, manager.setup(TOKENIZER, tmp_path / "cache")


def cached_texts(dataset) -> list[str]:
    return [TOKENIZER.decode(ids) for ids in dataset["input_ids"]]


def test_malformed_jsonl_line_fails_naming_the_file_and_line(tmp_path):
    bad = write_lines(tmp_path / "bad.jsonl", ['{"text": "one"}', '{"text": "two"', '{"text": "three"}'])
    with pytest.raises(DataSourceError) as info:
        prepare(tmp_path, [bad])
    message = str(info.value)
    assert "source 'src'" in message
    assert f"{bad} line 2: not valid JSON" in message
    assert "JSON parse error" in message  # the root cause from pyarrow, not just "generation failed"


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ('{"text": null}', "expected a string, got None"),
        ('{"text": 12}', "expected a string, got int"),
        ('{"other": "no text field"}', "expected a string, got None"),
    ],
    ids=["none", "non-string", "missing-field"],
)
def test_bad_row_without_error_budget_fails_naming_row_and_column(tmp_path, row, problem):
    data = write_lines(tmp_path / "a.jsonl", ['{"text": "fine 0"}', '{"text": "fine 1"}', row, '{"text": "fine 3"}'])
    with pytest.raises(PreprocessError, match=rf"source 'src' .*row 2, column 'text': {problem}"):
        prepare(tmp_path, [data])


def bad_rows_file(tmp_path: Path) -> tuple[Path, list[str]]:
    """40 rows, three of them bad (rows 3, 17 and 30); returns the file and the good texts."""
    rows = [{"text": f"good {i}"} for i in range(40)]
    rows[3], rows[17], rows[30] = {"text": None}, {"text": 12}, {"other": "x"}
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    good = [r["text"] for r in rows if isinstance(r.get("text"), str)]
    return path, good


@pytest.mark.parametrize("num_proc", [None, 2])
def test_bad_rows_within_the_budget_are_skipped_counted_and_left_out_of_the_cache(tmp_path, num_proc):
    data, good = bad_rows_file(tmp_path)
    with pytest.warns(UserWarning, match=r"skipped 3 rows whose preprocessing failed \(max_error_count=3\)"):
        manager, dataset = prepare(tmp_path, [data], max_error_count=3, num_proc=num_proc)
    assert cached_texts(dataset) == good  # only the good rows, in file order
    assert dataset.column_names == ["input_ids"]  # the error tag column is not cached
    commit = json.loads((manager.cache_dir_for(TOKENIZER, tmp_path / "cache") / COMPLETE_MARKER).read_text())
    assert commit["store"]["skipped_rows"] == 3 and commit["store"]["rows"] == 37


@pytest.mark.parametrize("num_proc", [None, 2])
def test_bad_rows_beyond_the_budget_raise_with_the_first_failure_row_and_traceback(tmp_path, num_proc):
    # With num_proc=2 each process sees at most 2 bad rows: only the global count exceeds the budget.
    data, _ = bad_rows_file(tmp_path)
    with pytest.raises(PreprocessError) as info:
        prepare(tmp_path, [data], max_error_count=2, num_proc=num_proc)
    message = str(info.value)
    assert "max_error_count=2" in message
    if num_proc == 2:  # neither process alone went over the budget: the total over the dataset did
        assert "3 rows failed preprocessing, more than max_error_count=2" in message
    assert "First failure: source 'src'" in message and "row 3, column 'text': expected a string, got None" in message
    assert "Traceback (most recent call last)" in message
    manager = LocalDatasetManager(data_files=str(data), max_error_count=2)
    assert not manager.cache_dir_for(TOKENIZER, tmp_path / "cache").exists()  # nothing half-written


def test_a_file_that_is_empty_fails_naming_it_and_an_empty_file_among_others_is_warned_about(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    with pytest.warns(UserWarning, match="is empty"), pytest.raises(DataSourceError, match=rf"{empty} is empty \(0 b"):
        prepare(tmp_path, [empty])
    good = write_jsonl(tmp_path / "good.jsonl", ["one", "two"])
    with pytest.warns(UserWarning, match=rf"data file {empty} is empty; it adds no rows"):
        _, dataset = prepare(tmp_path, [good, empty], name="mixed")
    assert cached_texts(dataset) == ["one", "two"]


def test_column_missing_in_one_of_several_files_fails_listing_each_files_columns(tmp_path):
    first = write_jsonl(tmp_path / "first.jsonl", ["a", "b"])
    second = write_jsonl(tmp_path / "second.jsonl", ["c", "d"], column="body")
    with pytest.raises(DataSourceError) as info:
        prepare(tmp_path, [first, second])
    message = str(info.value)
    assert "the files have different columns (first.jsonl: ['text']; second.jsonl: ['body'])" in message
    assert "column names don't match" in message  # datasets' own cause is kept


def test_non_utf8_bytes_in_jsonl_fail_naming_row_column_file_and_line(tmp_path):
    data = tmp_path / "latin1.jsonl"
    data.write_bytes(b'{"text": "fine"}\n{"text": "caf\xe9"}\n')
    with pytest.raises(PreprocessError) as info:
        prepare(tmp_path, [data])
    message = str(info.value)
    assert "row 1, column 'text'" in message
    assert f"{data} line 2: not valid UTF-8 (byte 0xe9" in message


@pytest.mark.parametrize("ds_type", ["text", "csv"])
def test_non_utf8_bytes_in_text_and_csv_fail_naming_file_and_line(tmp_path, ds_type):
    data = tmp_path / f"latin1.{ds_type}"
    data.write_bytes(b"text\nfine\ncaf\xe9\n")
    with pytest.raises(DataSourceError, match=rf"{data} line 3: not valid UTF-8 \(byte 0xe9"):
        prepare(tmp_path, [data], ds_type=ds_type)


def datamodule(tmp_path: Path, manager: LocalDatasetManager, **options) -> TextDataModule:
    options = {"max_seq_len": 16, "batch_size": 2, "num_workers": 0, "seed": 0, **options}
    dm = TextDataModule(dataset_managers={"train": {"src": manager}}, cache_dir=str(tmp_path / "cache"), **options)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_a_preprocess_function_that_filters_out_every_row_fails_naming_the_source(tmp_path):
    data = write_jsonl(tmp_path / "a.jsonl", ["x", "y", "z"])
    manager = LocalDatasetManager(data_files=str(data), preprocess_function="reliability_fns.tokenize_nothing")
    with pytest.raises(PreprocessError, match=r"source 'src' .*: no rows left after preprocessing \(3 rows read"):
        datamodule(tmp_path, manager)
    assert not manager.cache_dir_for(TOKENIZER, tmp_path / "cache").exists()


def test_a_filter_that_drops_every_sample_fails_instead_of_hanging(tmp_path):
    data = write_jsonl(tmp_path / "a.jsonl", [f"doc {i}" for i in range(12)])
    manager = LocalDatasetManager(data_files=str(data), filter_fn="reliability_fns.drop_everything")
    stream = datamodule(tmp_path, manager).build_train_stream()
    with pytest.raises(RuntimeError, match=r"Source 'src': a full pass .* produced no usable document \(filtered: 12"):
        next(iter(stream))


@pytest.mark.parametrize("overlong", ["truncate", "drop"])
def test_documents_longer_than_max_seq_len_are_truncated_or_dropped_and_counted(tmp_path, overlong):
    texts = ["short", "x" * 40, "tiny", "y" * 50, "ok"]  # 2 documents longer than 16 tokens
    data = write_jsonl(tmp_path / "a.jsonl", texts)
    dm = datamodule(tmp_path, LocalDatasetManager(data_files=str(data), shuffle=False), overlong=overlong)
    stream = dm.build_train_stream()
    iterator = iter(stream)
    documents = [next(iterator) for _ in range(len(texts) - (2 if overlong == "drop" else 0))]
    assert all(len(d["input_ids"]) <= 16 for d in documents)
    state = stream.counters
    if overlong == "drop":
        assert [TOKENIZER.decode(d["input_ids"]) for d in documents] == ["short", "tiny", "ok"]
        assert state["overlong_dropped"] == 2
        assert sum(d.get("dropped_before", 0) for d in documents) == 2  # carried to the metrics
    else:
        assert state["overlong_truncated"] == 2
        assert [d.get("truncated_tokens", 0) for d in documents] == [0, 26, 0, 36, 0]
        assert TOKENIZER.decode(documents[1]["input_ids"]) == "x" * 15  # BOS + 15 bytes, EOS cut
    batch = dm.train_collator()([next(iterator) for _ in range(2)])
    assert batch["input_ids"].shape[1] <= 16
    assert np.all(batch["labels"].numpy()[batch["input_ids"].numpy() == TOKENIZER.pad_id] == -100)
