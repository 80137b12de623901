"""``lightning-tune-data prepare`` on a local cache_dir, run in-process through the CLI entry point:
which task a process runs (flags, a Slurm array, torchrun), its exit codes and one-line errors, the
local engine and ``--finalize``. The same command against S3, as separate processes, is
tests/suites/test_remote_store.py."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml
from conftest import make_texts, write_jsonl

from lightning_tune_data import prepare_task
from lightning_tune_data.preprocess import tokenize_text
from lightning_tune_data.cli import main as cli_main
from lightning_tune_data.commands.prepare import task_from_environment
from lightning_tune_data.report.batches import datamodule_from_config


def write_config(tmp_path: Path, cache_dir: Path) -> str:
    data = write_jsonl(tmp_path / "notes.jsonl", make_texts(23, seed=4, prefix="N"))
    content = {"data": {"max_seq_len": 32, "batch_size": 2, "cache_dir": str(cache_dir), "dataset_managers": {
        "train": {"notes": {"class_path": "lightning_tune_data.LocalDatasetManager",
                            "init_args": {"data_files": str(data)}}}}}}
    path = tmp_path / "prepare.yaml"
    path.write_text(yaml.safe_dump(content), encoding="utf-8")
    return str(path)


def prepare(*args: str) -> int:
    with pytest.raises(SystemExit) as exited:
        cli_main(["prepare", *args])
    return exited.value.code


def stored_rows(config: str, cache_dir: Path) -> list[list[int]]:
    datamodule = datamodule_from_config(config, cache_dir=str(cache_dir))
    datamodule.prepare_data()
    datamodule.setup("fit")
    return [list(ids) for ids in datamodule.dataset("train", "notes")["input_ids"]]


@pytest.mark.parametrize(("environ", "task"), [
    ({"SLURM_ARRAY_TASK_ID": "3", "SLURM_ARRAY_TASK_COUNT": "4"}, (3, 4)),
    ({"SLURM_ARRAY_TASK_ID": "4", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "1"}, (3, 4)),
    ({"SLURM_ARRAY_TASK_ID": "13", "SLURM_ARRAY_TASK_COUNT": "4", "SLURM_ARRAY_TASK_MIN": "1",
      "SLURM_ARRAY_TASK_STEP": "4"}, (3, 4)),  # --array=1-13:4
    # torchrun inside an array: every rank of every element its own task (not all ranks one task)
    ({"SLURM_ARRAY_TASK_ID": "0", "SLURM_ARRAY_TASK_COUNT": "2", "RANK": "5", "WORLD_SIZE": "8"}, (5, 16)),
    ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2", "RANK": "5", "WORLD_SIZE": "8"}, (13, 16)),
    ({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}, (5, 8)),
    ({"SLURM_ARRAY_TASK_ID": "2"}, None),  # not an array's full environment
    ({}, None),
])
def test_the_task_comes_from_a_slurm_array_else_from_torchrun(environ, task):
    assert task_from_environment(environ) == task


@pytest.mark.parametrize("environ", [{"RANK": "8", "WORLD_SIZE": "8"}, {"RANK": "x", "WORLD_SIZE": "8"},
                                     {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_COUNT": "4"}])
def test_an_environment_naming_no_task_is_a_clear_error(environ):
    with pytest.raises(ValueError, match=r"pass --task-index and --num-tasks"):
        task_from_environment(environ)


def test_a_task_index_outside_the_task_count_fails_with_one_clear_line_and_writes_nothing(tmp_path, capsys):
    config = write_config(tmp_path, tmp_path / "cache")
    assert prepare("--config", config, "--task-index", "5", "--num-tasks", "4") == 2
    err = capsys.readouterr().err.strip()
    assert err == ("lightning-tune-data prepare: task index 5 of 4 tasks: the index must be in 0..3 and the number "
                   "of tasks at least 1.")
    assert prepare("--config", config, "--task-index", "1") == 2
    assert capsys.readouterr().err.strip() == "lightning-tune-data prepare: --task-index needs --num-tasks"
    assert not (tmp_path / "cache").exists()


def test_a_config_without_a_data_section_fails_with_one_line(tmp_path, capsys):
    path = tmp_path / "empty.yaml"
    path.write_text("trainer: {max_steps: 1}\n", encoding="utf-8")
    assert prepare("--config", str(path), "--task-index", "0", "--num-tasks", "1") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no 'data:' section" in err


def test_finalize_names_the_unfinished_task_with_exit_1_then_commits_once_it_ran(tmp_path, capsys):
    cache = tmp_path / "cache"
    config = write_config(tmp_path, cache)
    assert prepare("--config", config, "--finalize") == 1
    assert "no task has written the store" in capsys.readouterr().err
    prepare_task(config, 0, 2)
    capsys.readouterr()
    assert prepare("--config", config, "--finalize") == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "task 1 of 2 has not finished" in err and "--num-tasks 2" in err

    assert prepare("--config", config, "--task-index", "1", "--num-tasks", "2") == 0
    assert "task 1 of 2: train/notes: written" in capsys.readouterr().out
    assert prepare("--config", config, "--finalize") == 0
    assert capsys.readouterr().out.strip() == "train/notes: committed before"


def test_the_local_engine_runs_every_task_and_its_store_equals_the_one_task_store(tmp_path, capsys):
    cache = tmp_path / "cache"
    config = write_config(tmp_path, cache)
    assert prepare("--config", config, "--engine", "local", "--num-tasks", "3") == 0
    out = capsys.readouterr().out
    assert [line.split(":")[0] for line in out.splitlines()] == [f"task {i} of 3" for i in range(3)]
    [store] = cache.glob("notes-*")
    assert out.splitlines()[-1].endswith(f"store committed at {store}")
    assert json.loads((store / "_COMPLETE.json").read_text())["store"]["num_tasks"] == 3
    assert stored_rows(config, cache) == stored_rows(config, tmp_path / "one_task_cache")
    assert len(stored_rows(config, cache)) == 23


def kill_on_marker(examples: dict, tokenizer, **kwargs) -> dict:
    """A preprocess function that dies like a process the out-of-memory killer picked, on the row ``KILL``."""
    if "KILL" in examples["text"]:
        os.kill(os.getpid(), signal.SIGKILL)
    return tokenize_text(examples, tokenizer)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_killed_mid_task_ends_the_local_engine_at_once_naming_the_task(tmp_path, capsys):
    files = [write_jsonl(tmp_path / "a.jsonl", make_texts(9, seed=1)), tmp_path / "b.jsonl"]
    files[1].write_text('{"text": "fine"}\n{"text": "KILL"}\n', encoding="utf-8")
    content = {"data": {"max_seq_len": 32, "batch_size": 2, "cache_dir": str(tmp_path / "cache"), "dataset_managers": {
        "train": {"notes": {"class_path": "lightning_tune_data.LocalDatasetManager", "init_args": {
            "data_files": [str(f) for f in files], "preprocess_function": "test_prepare.kill_on_marker"}}}}}}
    config = tmp_path / "kill.yaml"
    config.write_text(yaml.safe_dump(content), encoding="utf-8")
    started = time.monotonic()
    assert prepare("--config", str(config), "--engine", "local", "--num-tasks", "2", "--workers", "2") == 2
    assert time.monotonic() - started < 60
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith("lightning-tune-data prepare: task 1 of 2: its worker process was killed by SIGKILL, e.g. "
                          "by the out-of-memory killer.")
    assert "--task-index 1 --num-tasks 2" in err


def test_prepare_repair_names_every_store_it_checked(tmp_path, capsys):
    config = write_config(tmp_path, tmp_path / "cache")
    assert prepare("--config", config, "--task-index", "0", "--num-tasks", "1") == 0
    capsys.readouterr()
    assert prepare("--config", config, "--repair") == 0
    assert capsys.readouterr().out.startswith("train/notes: intact (")


def test_finalize_names_every_unfinished_store_not_only_the_first(tmp_path, capsys):
    data = [write_jsonl(tmp_path / f"{name}.jsonl", make_texts(9, seed=i)) for i, name in enumerate(("notes", "web"))]
    content = {"data": {"max_seq_len": 32, "batch_size": 2, "cache_dir": str(tmp_path / "cache"), "dataset_managers": {
        "train": {name: {"class_path": "lightning_tune_data.LocalDatasetManager", "init_args": {"data_files": str(path)}}
                  for name, path in zip(("notes", "web"), data)}}}}
    config = tmp_path / "two.yaml"
    config.write_text(yaml.safe_dump(content), encoding="utf-8")
    assert prepare("--config", str(config), "--task-index", "0", "--num-tasks", "2") == 0
    capsys.readouterr()
    assert prepare("--config", str(config), "--finalize") == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("lightning-tune-data prepare: 2 stores are not committed: source 'notes'")
    assert "| source 'web'" in err and err.count("task 1 of 2 has not finished") == 2


def test_prepare_accepts_data_overrides_as_fit_does(tmp_path, capsys):
    config = write_config(tmp_path, tmp_path / "cache")
    moved = tmp_path / "moved"
    assert prepare("--config", config, "--task-index", "0", "--num-tasks", "1", f"--data.cache_dir={moved}",
                   "--data.shard_size", "100B") == 0
    [store] = moved.glob("notes-*")
    assert len(json.loads((store / "_COMPLETE.json").read_text())["store"]["shards"]) > 1  # 100-byte shards
    assert not (tmp_path / "cache").exists()
    assert prepare("--config", config, "--bogus", "1") == 2
    assert "unrecognized argument '--bogus'" in capsys.readouterr().err


@pytest.mark.slow
def test_local_engine_workers_do_not_interleave_progress_bars(tmp_path, capfd):
    config = write_config(tmp_path, tmp_path / "cache")
    assert prepare("--config", config, "--engine", "local", "--num-tasks", "2", "--workers", "2") == 0
    out, err = capfd.readouterr()
    assert "Tokenizing" not in err  # two workers' bars would overwrite each other on one line
    assert sorted(line.split(":")[0] for line in out.splitlines() if line.startswith("task ")) == [
        "task 0 of 2", "task 1 of 2"]
