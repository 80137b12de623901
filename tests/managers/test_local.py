"""LocalDatasetManager: file types inferred from extensions, blank text lines, download cache, weights."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from source_files import TEXTS, expected_ids, jsonl, token_rows, write_csv, write_jsonl, write_parquet, write_text  # noqa: F401

from lightning_tune_data import LocalDatasetManager
from lightning_tune_data.cache.marker import is_valid_cache
from lightning_tune_data.managers import DataSourceError
from lightning_tune_data.tokenizers import ByteTokenizer

TOK = ByteTokenizer()
ROWS = [{"text": f"document {i}"} for i in range(6)]


def write(path: Path) -> Path:
    name = path.name.removesuffix(".gz")
    if name.endswith((".jsonl", ".json")):
        data = "".join(json.dumps(row) + "\n" for row in ROWS).encode()
    elif name.endswith(".csv"):
        data = ("text\n" + "".join(row["text"] + "\n" for row in ROWS)).encode()
    elif name.endswith(".txt"):
        data = "".join(row["text"] + "\n" for row in ROWS).encode()
    else:
        pq.write_table(pa.Table.from_pylist(ROWS), path)
        return path
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def texts(manager: LocalDatasetManager, cache_dir: Path) -> list[str]:
    manager.prepare_data(TOK, cache_dir)
    return [TOK.decode(list(ids)[1:-1]) for ids in manager.setup(TOK, cache_dir)["input_ids"]]


@pytest.mark.parametrize(
    ("filename", "inferred"),
    [("web.parquet", "parquet"), ("rows.csv", "csv"), ("lines.txt", "text"), ("docs.jsonl", "json"),
     ("docs.json.gz", "json"), ("rows.csv.gz", "csv")],
)
def test_ds_type_is_inferred_from_the_file_extension(tmp_path: Path, filename: str, inferred: str) -> None:
    manager = LocalDatasetManager(data_files=str(write(tmp_path / filename)))
    assert manager.ds_type == inferred
    assert texts(manager, tmp_path / "cache") == [row["text"] for row in ROWS]


def test_glob_of_parquet_files_loads_without_ds_type(tmp_path: Path) -> None:
    (tmp_path / "web").mkdir()
    write(tmp_path / "web" / "a.parquet")
    write(tmp_path / "web" / "b.parquet")
    manager = LocalDatasetManager(data_files=str(tmp_path / "web" / "*.parquet"))
    assert manager.ds_type == "parquet"
    assert len(texts(manager, tmp_path / "cache")) == 2 * len(ROWS)


def test_explicit_ds_type_that_contradicts_the_extension_is_named(tmp_path: Path) -> None:
    path = write(tmp_path / "web.parquet")
    with pytest.raises(DataSourceError, match=r"ds_type 'json' conflicts with the extension of data_files "
                                              r"\{'parquet': \['web.parquet'\]\}.*leave ds_type unset"):
        LocalDatasetManager(data_files=str(path), ds_type="json")


def test_explicit_ds_type_is_used_for_unknown_extensions(tmp_path: Path) -> None:
    path = tmp_path / "export.data"
    path.write_text("".join(json.dumps(row) + "\n" for row in ROWS))
    assert texts(LocalDatasetManager(data_files=str(path), ds_type="json"), tmp_path / "c") == [r["text"] for r in ROWS]
    with pytest.raises(DataSourceError, match=r"cannot infer ds_type from the extension of data_files \['export.data'\]"):
        LocalDatasetManager(data_files=str(path))


def test_mixed_file_types_in_one_manager_are_an_error(tmp_path: Path) -> None:
    files = [str(write(tmp_path / "a.csv")), str(write(tmp_path / "b.jsonl"))]
    with pytest.raises(DataSourceError, match=r"data_files mix file types .*one LocalDatasetManager per file type"):
        LocalDatasetManager(data_files=files)


def test_text_files_keep_blank_lines_unless_skip_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("first\n\n   \nsecond\n")
    assert texts(LocalDatasetManager(data_files=str(path)), tmp_path / "a") == ["first", "", "   ", "second"]
    skipping = LocalDatasetManager(data_files=str(path), skip_blank_lines=True)
    assert texts(skipping, tmp_path / "b") == ["first", "second"]
    with pytest.raises(DataSourceError, match="skip_blank_lines applies to ds_type 'text' only"):
        LocalDatasetManager(data_files=str(write(tmp_path / "a.jsonl")), skip_blank_lines=True)


@pytest.mark.parametrize("weight", [True, False])
def test_boolean_weight_is_rejected(tmp_path: Path, weight: bool) -> None:
    with pytest.raises(DataSourceError, match=rf"weight must be a finite number >= 0, got {weight}"):
        LocalDatasetManager(data_files=str(write(tmp_path / "a.jsonl")), weight=weight)


def test_load_kwargs_cache_dir_is_used_for_the_download_cache(tmp_path: Path) -> None:
    manager = LocalDatasetManager(data_files=str(write(tmp_path / "a.jsonl")),
                                  load_kwargs={"cache_dir": str(tmp_path / "hf")})
    assert len(texts(manager, tmp_path / "cache")) == len(ROWS)
    assert any((tmp_path / "hf").iterdir())
    assert not (tmp_path / "cache" / "hf_datasets").exists()


def test_load_kwargs_that_repeat_manager_arguments_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(DataSourceError, match=r"load_kwargs \['split'\] repeat arguments .* remove them from load_kwargs"):
        LocalDatasetManager(data_files=str(write(tmp_path / "a.jsonl")), load_kwargs={"split": "train"})


def test_prepare_shows_one_progress_bar_per_source_and_restores_the_setting(tmp_path: Path, capfd) -> None:
    datasets.enable_progress_bars()
    manager = LocalDatasetManager(data_files=str(write(tmp_path / "a.jsonl")))
    capfd.readouterr()
    manager.prepare_data(TOK, tmp_path / "cache")
    err = capfd.readouterr().err
    assert "Tokenizing source" in err
    assert "Generating train split" not in err and "Saving the dataset" not in err
    assert datasets.is_progress_bar_enabled()


@pytest.mark.parametrize(
    ("ds_type", "suffix", "writer"),
    [
        ("json", ".jsonl", write_jsonl),
        ("jsonl", ".jsonl", write_jsonl),
        ("csv", ".csv", write_csv),
        ("parquet", ".parquet", write_parquet),
        ("text", ".txt", write_text),
    ],
)
def test_local_manager_caches_tokenized_documents_for_each_file_type(
    tmp_path: Path, ds_type: str, suffix: str, writer
) -> None:
    path = writer(tmp_path / f"corpus{suffix}", [{"text": t, "id": i} for i, t in enumerate(TEXTS)])
    manager = LocalDatasetManager(data_files=str(path), ds_type=ds_type)
    cache_dir = tmp_path / "cache"

    built = manager.prepare_data(TOK, cache_dir)

    assert built == manager.cache_dir_for(TOK, cache_dir)
    assert built.name == f"corpus-train-{manager.fingerprint(TOK)[:16]}"
    assert is_valid_cache(built)
    dataset = manager.setup(TOK, cache_dir)
    assert isinstance(dataset, datasets.Dataset)
    assert dataset.column_names == ["input_ids"]
    assert token_rows(dataset) == [expected_ids(t) for t in TEXTS]
    # Memory-mapped from the cache directory, not from datasets' own download cache.
    assert all(Path(f["filename"]).is_relative_to(built) for f in dataset.cache_files)


def test_local_manager_accepts_split_mapping_globs_and_several_files(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "part-0.jsonl", [{"text": "a"}, {"text": "b"}])
    write_jsonl(tmp_path / "part-1.jsonl", [{"text": "c"}])
    write_jsonl(tmp_path / "val.jsonl", [{"text": "v"}])
    manager = LocalDatasetManager(
        data_files={"train": str(tmp_path / "part-*.jsonl"), "validation": str(tmp_path / "val.jsonl")},
        split="validation",
    )
    manager.prepare_data(TOK, tmp_path / "cache")
    assert token_rows(manager.setup(TOK, tmp_path / "cache")) == [expected_ids("v")]

    train = LocalDatasetManager(data_files=str(tmp_path / "part-*.jsonl"))
    assert [Path(f).name for f in train.data_files] == ["part-0.jsonl", "part-1.jsonl"]
    train.prepare_data(TOK, tmp_path / "cache")
    assert token_rows(train.setup(TOK, tmp_path / "cache")) == [expected_ids(t) for t in "abc"]


def test_local_manager_with_other_split_name_loads_a_plain_file_list(tmp_path: Path, jsonl: Path) -> None:
    manager = LocalDatasetManager(data_files=[str(jsonl)], split="validation")
    manager.prepare_data(TOK, tmp_path / "cache")
    assert len(manager.setup(TOK, tmp_path / "cache")) == len(TEXTS)


def test_missing_files_are_listed_before_anything_runs(tmp_path: Path, jsonl: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        LocalDatasetManager(
            data_files=[str(jsonl), str(tmp_path / "nope.jsonl"), str(tmp_path / "sub" / "gone-*.jsonl")]
        )
    message = str(info.value)
    assert "2 file(s) not found" in message
    assert str(tmp_path / "nope.jsonl") in message
    assert str(tmp_path / "sub" / "gone-*.jsonl") in message
    assert str(jsonl) not in message  # the existing file is not reported


def test_bad_ds_type_split_weight_and_num_proc_are_rejected(tmp_path: Path, jsonl: Path) -> None:
    with pytest.raises(DataSourceError, match=r"ds_type 'xml' is not supported; use one of"):
        LocalDatasetManager(data_files=str(jsonl), ds_type="xml")
    with pytest.raises(DataSourceError, match=r"split 'test' is not a key of data_files; set split to one of \['train'\]"):
        LocalDatasetManager(data_files={"train": str(jsonl)}, split="test")
    with pytest.raises(DataSourceError, match=r"weight must be a finite number >= 0"):
        LocalDatasetManager(data_files=str(jsonl), weight=-1.0)
    with pytest.raises(DataSourceError, match=r"num_proc must be None or >= 1"):
        LocalDatasetManager(data_files=str(jsonl), num_proc=0)
