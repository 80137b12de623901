"""Config and data errors are one line: config path, manager, what is wrong, the fix.

The behaviour is checked on the real command line (``python -m lightning_tune_data fit`` in a
subprocess, on tiny generated configs and data); the message builders are also checked directly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import make_texts, write_jsonl

from lightning_tune_data.cli.error_lines import (
    VERBOSE_VARIABLE,
    config_files,
    describe_parse_error,
    describe_run_error,
    did_you_mean,
    error_line,
    verbose,
)

REPO = Path(__file__).resolve().parents[2]
PREFIX = "lightning-tune-data: error: "
# At most Lightning's own start-up lines (seed, GPU, TPU) and the error itself.
MAX_STDERR_LINES = 4


def tiny_config(root: Path) -> dict:
    """A one-step fit on two small JSONL sources, no validation, nothing written but the cache."""
    write_jsonl(root / "data" / "a.jsonl", make_texts(12, seed=1, prefix="A"))
    write_jsonl(root / "data" / "b.jsonl", make_texts(12, seed=2, prefix="B"))
    local = "lightning_tune_data.LocalDatasetManager"
    return {
        "seed_everything": 0,
        "trainer": {"accelerator": "cpu", "devices": 1, "max_steps": 1, "limit_val_batches": 0, "logger": False,
                    "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False},
        "model": {"class_path": "lightning_tune_data.models.TinyCausalLM",
                  "init_args": {"d_model": 16, "n_layers": 1, "n_heads": 2}},
        "data": {
            "max_seq_len": 32, "batch_size": 2, "cache_dir": str(root / "cache"),
            "dataset_managers": {"train": {
                "a": {"class_path": local, "init_args": {"data_files": str(root / "data" / "a.jsonl"), "weight": 0.5}},
                "b": {"class_path": local, "init_args": {"data_files": str(root / "data" / "b.jsonl"), "weight": 0.5}},
            }},
        },
    }


def write(root: Path, config: dict, name: str = "run.yaml") -> Path:
    path = root / "configs" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run_fit(config: Path, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key != VERBOSE_VARIABLE}
    environment.update({"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", **env})
    return subprocess.run([sys.executable, "-m", "lightning_tune_data", "fit", "--config", str(config.relative_to(cwd))],
                          cwd=cwd, capture_output=True, text=True, timeout=300, env=environment)


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The error line, after checking the run failed with a short stderr and no traceback."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "usage:" not in result.stderr, result.stderr[-3000:]
    assert len(lines) <= MAX_STDERR_LINES, result.stderr
    assert lines[-1].startswith(PREFIX), result.stderr
    return lines[-1]


# -- on the command line --------------------------------------------------------------------------
def test_misspelt_manager_option_is_one_line_naming_the_manager_the_file_and_the_right_key(tmp_path):
    config = tiny_config(tmp_path)
    init_args = config["data"]["dataset_managers"]["train"]["b"]["init_args"]
    init_args["data_file"] = init_args.pop("data_files")
    line = one_line_error(run_fit(write(tmp_path, config), tmp_path))
    assert line == (f"{PREFIX}data.dataset_managers.train.b (LocalDatasetManager): option 'data_file' is not "
                    "accepted. Did you mean 'data_files'? (in configs/run.yaml)")


def test_misspelt_datamodule_option_is_one_line_suggesting_the_right_key(tmp_path):
    config = tiny_config(tmp_path)
    config["data"]["max_seq_length"] = config["data"].pop("max_seq_len")
    line = one_line_error(run_fit(write(tmp_path, config), tmp_path))
    assert line == f"{PREFIX}data.max_seq_length: no such option in data. Did you mean 'max_seq_len'? (in configs/run.yaml)"


def test_wrong_text_column_is_one_line_addressed_by_the_source_config_path(tmp_path):
    config = tiny_config(tmp_path)
    config["data"]["dataset_managers"]["train"]["a"]["init_args"]["preprocess_kwargs"] = {"text_column": "txt"}
    line = one_line_error(run_fit(write(tmp_path, config), tmp_path))
    assert line.startswith(f"{PREFIX}data.dataset_managers.train.a (LocalDatasetManager, json data_files=['a.jsonl']): "
                           "column 'txt' not found")
    assert line.endswith("Did you mean 'text'? Set preprocess_kwargs: {text_column: text}.")


@pytest.mark.slow
def test_wrong_prompt_column_is_one_line_naming_the_option_to_set(tmp_path):
    config = tiny_config(tmp_path)
    init_args = config["data"]["dataset_managers"]["train"]["a"]["init_args"]
    init_args["preprocess_function"] = "lightning_tune_data.preprocess.tokenize_prompt_completion"
    init_args["preprocess_kwargs"] = {"prompt_column": "question"}
    line = one_line_error(run_fit(write(tmp_path, config), tmp_path))
    assert line.startswith(f"{PREFIX}data.dataset_managers.train.a (LocalDatasetManager, ")
    assert "column 'question' not found" in line and "Set preprocess_kwargs: {prompt_column: <one of ['text']>}" in line


@pytest.mark.slow
def test_unreachable_hub_dataset_is_one_line_naming_the_source_and_what_to_check(tmp_path):
    config = tiny_config(tmp_path)
    config["data"]["dataset_managers"]["train"]["a"] = {
        "class_path": "lightning_tune_data.DatasetManager",
        "init_args": {"path": "nobody/no-such-dataset", "split": "train"},
    }
    line = one_line_error(run_fit(write(tmp_path, config), tmp_path))
    assert line.startswith(f"{PREFIX}data.dataset_managers.train.a (DatasetManager, path='nobody/no-such-dataset', "
                           "split='train'): datasets.load_dataset failed")
    assert "Check path/name/split/data_files" in line


@pytest.mark.slow
def test_verbose_variable_brings_back_the_full_parser_message_and_the_traceback(tmp_path):
    config = tiny_config(tmp_path)
    config["data"]["max_seq_length"] = 32
    typo = run_fit(write(tmp_path, config, "typo.yaml"), tmp_path, **{VERBOSE_VARIABLE: "1"})
    assert typo.returncode == 2 and "usage:" in typo.stderr
    assert "does not accept option 'data.max_seq_length'" in typo.stderr

    config = tiny_config(tmp_path)
    config["data"]["dataset_managers"]["train"]["a"]["init_args"]["preprocess_kwargs"] = {"text_column": "txt"}
    column = run_fit(write(tmp_path, config, "column.yaml"), tmp_path, **{VERBOSE_VARIABLE: "1"})
    assert column.returncode == 1
    assert "Traceback (most recent call last)" in column.stderr and "MissingColumnError" in column.stderr
    assert "ConfigError: data.dataset_managers.train.a (LocalDatasetManager" in column.stderr


# -- the message builders -------------------------------------------------------------------------
def test_did_you_mean_suggests_only_a_close_spelling():
    assert did_you_mean("wieght", ["weight", "stages"]) == " Did you mean 'weight'?"
    assert did_you_mean("zzz", ["weight", "stages"]) == ""


def test_error_line_is_a_single_line():
    assert error_line("data.x:\n  first\n  second") == f"{PREFIX}data.x: first second"


def test_verbose_reads_the_variable(monkeypatch):
    monkeypatch.delenv(VERBOSE_VARIABLE, raising=False)
    assert not verbose()
    monkeypatch.setenv(VERBOSE_VARIABLE, "0")
    assert not verbose()
    monkeypatch.setenv(VERBOSE_VARIABLE, "1")
    assert verbose()


def test_config_files_are_resolved_before_the_parser_changes_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "one.yaml").write_text("data: {}\n")
    files = config_files(["fit", "--config", "one.yaml", "-c", "missing.yaml", "--config=one.yaml"])
    assert files == {"one.yaml": tmp_path / "one.yaml"}


def test_a_literal_choice_is_named_with_its_allowed_values_and_the_closest_one():
    message = ('Parser key "data.packing":\n  Does not validate against any of the Union subtypes\n  Errors:\n'
               "    - Expected a typing.Literal['greedy', 'best_fit', 'concat']\n  Given value type: <class 'str'>\n"
               "  Given value: bestfit")
    assert describe_parse_error(message, [], {}) == (
        "data.packing: 'bestfit' is not one of greedy, best_fit, concat. Did you mean 'best_fit'?")


def test_a_misspelt_subcommand_lists_every_subcommand():
    message = "argument subcommand: invalid choice: 'fitt' (choose from 'fit', 'validate')"
    described = describe_parse_error(message, [], {}, ["fit", "validate", "report"])
    assert described == "'fitt' is not a subcommand; choose one of fit, validate, report. Did you mean 'fit'?"


def test_a_misspelt_class_path_suggests_the_class(tmp_path):
    path = write(tmp_path, {"data": {"dataset_managers": {"val": {"v": {
        "class_path": "lightning_tune_data.LocalDatasetManagr", "init_args": {"data_files": "v.jsonl"}}}}}})
    message = ('Parser key "data.dataset_managers":\n  Errors:\n    - Problem with given class_path '
               "'lightning_tune_data.LocalDatasetManagr':\n        module 'lightning_tune_data' has no attribute "
               "'LocalDatasetManagr'\n")
    assert describe_parse_error(message, [], {"run.yaml": path}) == (
        "data.dataset_managers.val.v: class_path 'lightning_tune_data.LocalDatasetManagr' cannot be imported. "
        "Did you mean 'lightning_tune_data.LocalDatasetManager'? (in run.yaml)")


def test_a_data_error_from_a_dataloader_worker_keeps_only_its_message():
    from lightning_tune_data.managers.errors import DataSourceError

    error = DataSourceError("Caught DataSourceError in DataLoader worker process 0.\nOriginal Traceback (most recent "
                            "call last):\n  File \"x.py\", line 1, in f\nlightning_tune_data.managers.errors."
                            "DataSourceError: source 'web' (path='a/b', split='train'): read failed. Retry later.\n")
    managers = {"train": {"web": {"class_path": "lightning_tune_data.DatasetManager"}}}
    assert describe_run_error(error, managers) == (
        "data.dataset_managers.train.web (DatasetManager, path='a/b', split='train'): read failed. Retry later.")


def test_a_data_error_of_an_unknown_source_is_kept_as_it_is():
    assert describe_run_error(ValueError("source 'x' (files): broken."), {"train": {}}) == "source 'x' (files): broken."
