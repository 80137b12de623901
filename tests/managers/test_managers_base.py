"""The manager lifecycle: caching, invalidation, crash safety and pickling."""

from __future__ import annotations

import copy
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

import pytest
from source_files import CALLS, TEXTS, TOK, OtherByteTokenizer, counting_tokenize, expected_ids, jsonl, token_rows, write_jsonl  # noqa: F401 - fixtures

import lightning_tune_data
from lightning_tune_data.cache.fingerprints import fingerprint
from lightning_tune_data.cache.marker import is_valid_cache
from lightning_tune_data.managers import CacheMissingError, DatasetManager, LocalDatasetManager, UnconditionalGenerationDatasetManager


REPO_ROOT = Path(__file__).resolve().parents[2]


def test_prepare_data_twice_does_the_work_once(tmp_path: Path, jsonl: Path) -> None:
    cache_dir = tmp_path / "cache"
    manager = LocalDatasetManager(data_files=str(jsonl), preprocess_function=counting_tokenize)
    start = dict(CALLS)
    first = manager.prepare_data(TOK, cache_dir)
    after_first = dict(CALLS)
    assert after_first["rows"] - start["rows"] >= len(TEXTS)

    # datasets' conversions of the data files are removed once the store is written, and a hit
    # does not make them again.
    hf_cache = cache_dir / "hf_datasets"
    assert not hf_cache.exists() and [p.name for p in cache_dir.iterdir() if p.is_dir()] == [first.name]
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


def _without_paths(parts: dict) -> dict:
    """Fingerprint parts with the absolute data-file paths (which differ per machine) replaced."""
    parts = copy.deepcopy(parts)
    for entry in parts["source"]["data_file_identities"]:
        entry["path"] = "<data>"
    return parts


def test_fingerprints_of_fixed_configurations_keep_their_recorded_values(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Existing caches are found by these values: a change here rebuilds every user's caches.
    monkeypatch.setattr(lightning_tune_data.version, "__version__", "0.2.0")
    monkeypatch.chdir(tmp_path)
    assert DatasetManager(full_name="owner/dataset/train").fingerprint(TOK) == (
        "e85da8cbfe6e08f660dcc242a24b0bc06d845d949e03c9c42d2b40ebe23b642a"
    )
    configured = DatasetManager(
        path="owner/dataset", name="cfg", split="train[:10%]", weight=2.0, shuffle=False, stages=["fit"],
        preprocess_function="lightning_tune_data.preprocess.tokenize_prompt_completion",
        preprocess_kwargs={"separator": "\n"}, columns_to_remove=["prompt"], max_error_count=3,
        load_kwargs={"revision": "main"}, message_transform="json.dumps",
    )
    assert configured.fingerprint(TOK) == "e8f85dd6781ace4b0393bd80ce5e61096b2f027808b9efe44cf0a70da34d2f24"
    pretokenized = DatasetManager(full_name="owner/dataset/train", preprocess_function=None)
    assert pretokenized.fingerprint(TOK) == "160e3750df8e1a23c45cadaddbff115c723bb15b5c950ad3004c8e3f4671701f"

    data = tmp_path / "corpus.jsonl"
    data.write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(5)))
    notes = tmp_path / "notes.txt"
    notes.write_text("a\n\nb\n")
    expected = {
        "5575e9908d97bacef2d7abc8f339cc4ba645533ba601bf6eaf40d4a473dc2195": LocalDatasetManager(data_files=str(data)),
        "80189546066d42d1c6ebec543c534707bcebf4bcef6be63c4f0449421bad189b": LocalDatasetManager(
            data_files=str(data), ds_type="json", split="validation", preprocess_kwargs={"add_eos": False},
            max_error_count=1, load_kwargs={"encoding": "utf-8"},
        ),
        "9b5672d755d3236e6b456c775733aabc4478d678fe54c1e890f65d95a7576faf": LocalDatasetManager(
            data_files=str(notes), skip_blank_lines=True
        ),
        "25d3565e1785f10127a3a9d8747ee4de4fa46f34ead1bcaaa4054a5fb55a04c2": DatasetManager(
            path="json", data_files="corpus.jsonl", split="train"
        ),
    }
    for value, manager in expected.items():
        assert fingerprint(_without_paths(manager.fingerprint_parts(TOK))) == value, manager
    assert expected["5575e9908d97bacef2d7abc8f339cc4ba645533ba601bf6eaf40d4a473dc2195"].cache_key() == "corpus-train"
    assert expected["25d3565e1785f10127a3a9d8747ee4de4fa46f34ead1bcaaa4054a5fb55a04c2"].cache_key() == "json-train"


def test_a_built_cache_records_its_source_and_inputs_in_the_marker_and_manifest(tmp_path: Path, jsonl: Path) -> None:
    manager = LocalDatasetManager(data_files=str(jsonl))
    manager.source_name = "notes/v1"
    built = manager.prepare_data(TOK, tmp_path / "cache")
    assert built.name == f"notes_v1-{manager.fingerprint(TOK, tmp_path / 'cache')[:16]}"
    marker = json.loads((built / "_COMPLETE.json").read_text())
    assert marker["metadata"] == {"fingerprint": manager.fingerprint(TOK), "manager": "LocalDatasetManager"}
    assert marker["inputs"]["source_key"] == "notes_v1" and marker["inputs"]["source_name"] == "notes/v1"
    assert marker["inputs"]["parts"] == json.loads(json.dumps(manager.fingerprint_parts(TOK)))
    assert marker["description"] == manager.source_description
    store = marker["store"]
    assert (store["rows"], store["skipped_rows"], store["num_tasks"]) == (len(TEXTS), 0, 1)
    assert [shard["path"] for shard in store["shards"]] == ["shards/task-00000-of-00001/00000.arrow"]
    assert set(marker["files"]) == {"shards/task-00000-of-00001/00000.arrow", "tasks/task-00000-of-00001.json",
                                    "tasks/task-00000-of-00001.done"}
