"""Dataset managers on generated local files: caching, invalidation, crash safety and errors."""

from __future__ import annotations

import csv
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lightning_tune_data.cache.marker import is_valid_cache
from lightning_tune_data.managers import (
    STAGES,
    CacheMissingError,
    DataSourceError,
    DatasetManager,
    LocalDatasetManager,
    UnconditionalGenerationDatasetManager,
    UnconditionalPrompts,
    parse_full_name,
)
from lightning_tune_data.preprocess import PreprocessError, tokenize_text
from lightning_tune_data.tokenizers import ByteTokenizer

REPO_ROOT = Path(__file__).resolve().parents[2]
TOK = ByteTokenizer()
BOS, EOS = TOK.bos_id, TOK.eos_id
TEXTS = [f"doc {i}: " + "word " * (i % 5) for i in range(20)]

#: Calls of :func:`counting_tokenize` (batches and rows), to prove cache hits do no work.
CALLS = {"batches": 0, "rows": 0}


def counting_tokenize(examples: dict[str, list], tokenizer: ByteTokenizer, text_column: str = "text") -> dict[str, list]:
    CALLS["batches"] += 1
    CALLS["rows"] += len(examples[text_column])
    return tokenize_text(examples, tokenizer, text_column=text_column)


class OtherByteTokenizer(ByteTokenizer):
    """Same ids, different identity: must never share a cache with ByteTokenizer."""

    @property
    def identity(self) -> str:
        return "OtherByteTokenizer:v1"


def expected_ids(text: str, bos: bool = True, eos: bool = True) -> list[int]:
    return ([BOS] if bos else []) + list(text.encode("utf-8")) + ([EOS] if eos else [])


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_text(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(row["text"] + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", [{"text": t, "id": i} for i, t in enumerate(TEXTS)])


def token_rows(dataset: datasets.Dataset, column: str = "input_ids") -> list[list]:
    return [list(row) for row in dataset[column]]


# --------------------------------------------------------------------------- local formats


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


# ------------------------------------------------------------------------- cache behaviour


def test_prepare_data_twice_does_the_work_once(tmp_path: Path, jsonl: Path) -> None:
    cache_dir = tmp_path / "cache"
    manager = LocalDatasetManager(data_files=str(jsonl), preprocess_function=counting_tokenize)
    start = dict(CALLS)
    first = manager.prepare_data(TOK, cache_dir)
    after_first = dict(CALLS)
    assert after_first["rows"] - start["rows"] >= len(TEXTS)

    # The download cache is not touched on a hit either: remove it and check nothing comes back.
    hf_cache = cache_dir / "hf_datasets"
    assert hf_cache.is_dir()
    shutil.rmtree(hf_cache)
    again = LocalDatasetManager(data_files=str(jsonl), preprocess_function=counting_tokenize)
    assert manager.prepare_data(TOK, cache_dir) == first
    assert again.prepare_data(TOK, cache_dir) == first
    assert CALLS == after_first
    assert not hf_cache.exists()


def test_other_tokenizer_identity_gets_its_own_cache(tmp_path: Path, jsonl: Path) -> None:
    cache_dir = tmp_path / "cache"
    manager = LocalDatasetManager(data_files=str(jsonl), preprocess_function=counting_tokenize)
    byte_dir = manager.prepare_data(TOK, cache_dir)
    other = OtherByteTokenizer()

    with pytest.raises(CacheMissingError, match=r"Caches of other configurations of this source exist"):
        manager.setup(other, cache_dir)

    rows_before = CALLS["rows"]
    other_dir = manager.prepare_data(other, cache_dir)
    assert other_dir != byte_dir
    assert CALLS["rows"] - rows_before >= len(TEXTS)  # tokenized again, not reused
    assert is_valid_cache(byte_dir) and is_valid_cache(other_dir)


def test_changing_preprocess_kwargs_gets_a_new_cache_with_new_content(tmp_path: Path, jsonl: Path) -> None:
    cache_dir = tmp_path / "cache"
    with_eos = LocalDatasetManager(data_files=str(jsonl))
    without_eos = LocalDatasetManager(data_files=str(jsonl), preprocess_kwargs={"add_eos": False})
    assert with_eos.prepare_data(TOK, cache_dir) != without_eos.prepare_data(TOK, cache_dir)
    assert token_rows(without_eos.setup(TOK, cache_dir))[0] == expected_ids(TEXTS[0], eos=False)
    assert token_rows(with_eos.setup(TOK, cache_dir))[0] == expected_ids(TEXTS[0])


def test_settings_that_do_not_change_content_share_the_cache(tmp_path: Path, jsonl: Path) -> None:
    a = LocalDatasetManager(data_files=str(jsonl), weight=1.0, shuffle=True, num_proc=None)
    b = LocalDatasetManager(data_files=str(jsonl), weight=5.0, shuffle=False, stages=["fit"], num_proc=2)
    assert a.cache_dir_for(TOK, tmp_path) == b.cache_dir_for(TOK, tmp_path)


def test_editing_a_data_file_invalidates_its_cache(tmp_path: Path, jsonl: Path) -> None:
    cache_dir = tmp_path / "cache"
    manager = LocalDatasetManager(data_files=str(jsonl))
    old_dir = manager.prepare_data(TOK, cache_dir)
    write_jsonl(jsonl, [{"text": "brand new"}])
    with pytest.raises(CacheMissingError):
        manager.setup(TOK, cache_dir)
    new_dir = manager.prepare_data(TOK, cache_dir)
    assert new_dir != old_dir
    assert token_rows(manager.setup(TOK, cache_dir)) == [expected_ids("brand new")]


def test_setup_without_prepare_data_says_to_run_prepare_data_first(tmp_path: Path, jsonl: Path) -> None:
    manager = LocalDatasetManager(data_files=str(jsonl))
    manager.source_name = "wiki"
    with pytest.raises(CacheMissingError) as info:
        manager.setup(TOK, tmp_path / "cache")
    message = str(info.value)
    assert message.startswith("source 'wiki' (json data_files=['corpus.jsonl']): no valid preprocessed cache")
    assert "Run prepare_data first" in message
    assert not (tmp_path / "cache").exists()  # setup never builds


def test_num_proc_tokenization_gives_the_same_rows_in_order(tmp_path: Path, jsonl: Path) -> None:
    single = LocalDatasetManager(data_files=str(jsonl))
    parallel = LocalDatasetManager(data_files=str(jsonl), num_proc=2)
    single.prepare_data(TOK, tmp_path / "c1")
    parallel.prepare_data(TOK, tmp_path / "c2")
    assert token_rows(parallel.setup(TOK, tmp_path / "c2")) == token_rows(single.setup(TOK, tmp_path / "c1"))


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


# ---------------------------------------------------------------------------- prompt masking


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


# --------------------------------------------------------------------------------- streaming


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


# ------------------------------------------------------------------------------ crash safety

_SLOW_MODULE = textwrap.dedent(
    """
    import os
    import time

    from lightning_tune_data.preprocess import tokenize_text


    def slow_tokenize(examples, tokenizer, text_column="text"):
        with open(os.environ["LTD_CALLS_FILE"], "a") as handle:
            handle.write(f"{len(examples[text_column])}\\n")
        if os.environ.get("LTD_SLOW") == "1" and len(examples[text_column]) > 8:
            time.sleep(120)  # the full-dataset .map batch: killed here
        return tokenize_text(examples, tokenizer, text_column=text_column)
    """
)

_PREPARE_SCRIPT = textwrap.dedent(
    """
    import sys
    from lightning_tune_data.managers import LocalDatasetManager
    from lightning_tune_data.tokenizers import ByteTokenizer

    manager = LocalDatasetManager(sys.argv[1], preprocess_function="ltd_slow_preprocess.slow_tokenize")
    manager.prepare_data(ByteTokenizer(), sys.argv[2])
    """
)


def test_kill_9_during_preprocessing_leaves_no_valid_cache_and_next_run_rebuilds(
    tmp_path: Path, jsonl: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module_dir = tmp_path / "modules"
    module_dir.mkdir()
    (module_dir / "ltd_slow_preprocess.py").write_text(_SLOW_MODULE)
    calls_file = tmp_path / "calls.txt"
    cache_dir = tmp_path / "cache"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(module_dir), os.environ.get("PYTHONPATH", "")]),
        "LTD_CALLS_FILE": str(calls_file),
        "LTD_SLOW": "1",
    }
    proc = subprocess.Popen([sys.executable, "-c", _PREPARE_SCRIPT, str(jsonl), str(cache_dir)], env=env, cwd=REPO_ROOT)
    deadline = time.monotonic() + 120
    # Probe batch (8 rows) then the .map batch (20 rows), which sleeps: kill during the .map.
    while not (calls_file.exists() and len(calls_file.read_text().split()) >= 2):
        assert proc.poll() is None, f"prepare process exited early with {proc.returncode}"
        assert time.monotonic() < deadline, "prepare process never reached the .map"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL

    monkeypatch.syspath_prepend(str(module_dir))
    monkeypatch.setenv("LTD_CALLS_FILE", str(calls_file))
    monkeypatch.delenv("LTD_SLOW", raising=False)
    manager = LocalDatasetManager(data_files=str(jsonl), preprocess_function="ltd_slow_preprocess.slow_tokenize")
    final_dir = manager.cache_dir_for(TOK, cache_dir)
    leftovers = list(cache_dir.glob(f".{final_dir.name}.tmp-*"))
    assert len(leftovers) == 1  # same fingerprint as the killed run; it died mid-build
    assert not final_dir.exists() and not is_valid_cache(final_dir)
    with pytest.raises(CacheMissingError):
        manager.setup(TOK, cache_dir)

    calls_before = len(calls_file.read_text().split())
    assert manager.prepare_data(TOK, cache_dir) == final_dir
    assert len(calls_file.read_text().split()) > calls_before  # really rebuilt
    assert not leftovers[0].exists()
    assert token_rows(manager.setup(TOK, cache_dir)) == [expected_ids(t) for t in TEXTS]
    monkeypatch.delitem(sys.modules, "ltd_slow_preprocess", raising=False)


# ---------------------------------------------------------------------------------- errors


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


def test_bad_row_error_names_the_global_row_and_column(tmp_path: Path) -> None:
    rows = [{"text": t} for t in TEXTS]
    rows[15] = {"text": None}
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    for num_proc in (None, 2):  # row 15 is past the probe and, with 2 processes, in shard 2
        manager = LocalDatasetManager(data_files=str(path), num_proc=num_proc)
        with pytest.raises(PreprocessError, match=r"bad\.jsonl.*row 15, column 'text': expected a string, got None"):
            manager.prepare_data(TOK, tmp_path / f"cache-{num_proc}")
        assert not is_valid_cache(manager.cache_dir_for(TOK, tmp_path / f"cache-{num_proc}"))


def test_bad_preprocess_path_fails_at_construction_naming_field_and_path(jsonl: Path) -> None:
    with pytest.raises(DataSourceError) as info:
        LocalDatasetManager(data_files=str(jsonl), preprocess_function="no_such_pkg_xyz.tokenize")
    message = str(info.value)
    assert "preprocess_function: cannot import 'no_such_pkg_xyz.tokenize'" in message
    assert "ModuleNotFoundError" in message and "corpus.jsonl" in message


def test_unknown_preprocess_kwarg_lists_accepted_parameters(jsonl: Path) -> None:
    with pytest.raises(DataSourceError, match=r"preprocess_kwargs \['text_col'\] are not parameters.*'text_column'"):
        LocalDatasetManager(data_files=str(jsonl), preprocess_kwargs={"text_col": "body"})


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


def test_stages_default_to_all_and_unknown_stage_is_named(jsonl: Path) -> None:
    assert LocalDatasetManager(data_files=str(jsonl)).stages == list(STAGES)
    assert LocalDatasetManager(data_files=str(jsonl), stages=["fit", "validate"]).stages == ["fit", "validate"]
    with pytest.raises(DataSourceError, match=r"invalid: \['training'\]; each stage must be one of \['fit', 'validate', 'test', 'predict'\]"):
        LocalDatasetManager(data_files=str(jsonl), stages=["fit", "training"])
    with pytest.raises(DataSourceError, match=r"stages"):
        UnconditionalGenerationDatasetManager(num_examples=3, stages=["train"])


def test_bad_ds_type_split_weight_and_num_proc_are_rejected(tmp_path: Path, jsonl: Path) -> None:
    with pytest.raises(DataSourceError, match=r"ds_type 'xml' is not supported; use one of"):
        LocalDatasetManager(data_files=str(jsonl), ds_type="xml")
    with pytest.raises(DataSourceError, match=r"split 'test' is not a key of data_files; set split to one of \['train'\]"):
        LocalDatasetManager(data_files={"train": str(jsonl)}, split="test")
    with pytest.raises(DataSourceError, match=r"weight must be a finite number >= 0"):
        LocalDatasetManager(data_files=str(jsonl), weight=-1.0)
    with pytest.raises(DataSourceError, match=r"num_proc must be None or >= 1"):
        LocalDatasetManager(data_files=str(jsonl), num_proc=0)


# -------------------------------------------------------------------------------- pickling


def test_managers_and_their_datasets_pickle_for_dataloader_workers(tmp_path: Path, jsonl: Path) -> None:
    manager = LocalDatasetManager(data_files=str(jsonl), preprocess_function=counting_tokenize)
    manager.prepare_data(TOK, tmp_path / "cache")
    dataset = manager.setup(TOK, tmp_path / "cache")
    clone = pickle.loads(pickle.dumps(manager))
    assert clone.cache_dir_for(TOK, tmp_path / "cache") == manager.cache_dir_for(TOK, tmp_path / "cache")
    assert token_rows(pickle.loads(pickle.dumps(dataset))) == token_rows(dataset)
    hub = pickle.loads(pickle.dumps(DatasetManager(full_name="o/d/c/train", weight=2.0)))
    assert (hub.path, hub.name, hub.split, hub.weight) == ("o/d", "c", "train", 2.0)
    unconditional = UnconditionalGenerationDatasetManager(num_examples=4)
    assert len(pickle.loads(pickle.dumps(unconditional.setup(TOK)))) == 4


# ------------------------------------------------------------------------------ unconditional


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("num_examples", [1, 2, 7, 10, 12])
def test_unconditional_examples_split_across_ranks_cover_each_index_once(num_examples: int, world_size: int) -> None:
    manager = UnconditionalGenerationDatasetManager(num_examples=num_examples)
    blocks = [manager.examples_for_rank(rank, world_size) for rank in range(world_size)]
    assert sorted(i for block in blocks for i in block) == list(range(num_examples))
    assert [i for block in blocks for i in block] == list(range(num_examples))  # contiguous, in rank order
    sizes = [len(block) for block in blocks]
    assert max(sizes) - min(sizes) <= 1


def test_unconditional_setup_yields_bos_prompts_with_provenance() -> None:
    manager = UnconditionalGenerationDatasetManager(num_examples=5, stages=["predict"])
    manager.source_name = "unconditional_prediction"
    assert manager.prepare_data(TOK, "/nonexistent") is None
    prompts = manager.setup(TOK, None)
    assert isinstance(prompts, UnconditionalPrompts) and len(prompts) == 5
    items = list(prompts)
    assert [item["index"] for item in items] == [0, 1, 2, 3, 4]
    for item in items:
        assert item["input_ids"].tolist() == [BOS]
        assert (item["source"], item["epoch"]) == ("unconditional_prediction", 0)
    rank1 = manager.setup(TOK, None, rank=1, world_size=2)
    assert [item["index"] for item in rank1] == manager.examples_for_rank(1, 2) == [3, 4]
    assert prompts[3]["index"] == 3
    with pytest.raises(DataSourceError, match=r"has no cache"):
        manager.cache_dir_for(TOK, "/tmp")


def test_unconditional_rejects_bad_num_examples_and_rank() -> None:
    with pytest.raises(DataSourceError, match=r"num_examples must be an integer >= 1"):
        UnconditionalGenerationDatasetManager(num_examples=0)
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size\)"):
        UnconditionalGenerationDatasetManager(num_examples=3).examples_for_rank(2, 2)
