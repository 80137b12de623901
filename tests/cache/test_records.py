"""Caches of real sources: checksums verified on reuse, read-only caches, content identity of data
files, the reason for each build, folders named after the source, token ids checked at build.
Real ``datasets`` caches, a real Trainer, a real immutable directory; then the records themselves:
what changed since the previous build, and which data files changed since a build."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import make_texts, write_jsonl
from lightning.pytorch import Trainer
from read_only_dir import read_only

from lightning_tune_data import ByteTokenizer, LocalDatasetManager, TextDataModule
from lightning_tune_data.cache.checksums import file_identity
from lightning_tune_data.cache.fingerprints import CACHE_FORMAT_VERSION
from lightning_tune_data.cache.marker import COMPLETE_MARKER
from lightning_tune_data.cache.records import (
    changed_data_file,
    describe_changes,
    previous_build,
    rebuild_reason,
    recorded_data_files,
)
from lightning_tune_data.cache.store import CacheReadOnlyError
from lightning_tune_data.models import TinyCausalLM
from lightning_tune_data.preprocess import PreprocessError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
TOKENIZER = ByteTokenizer()
TEXTS = make_texts(300, seed=5, prefix="D")
REPO_ROOT = Path(__file__).resolve().parents[2]


def datamodule(data: Path, cache_dir: Path, **kwargs) -> TextDataModule:
    source = LocalDatasetManager(data_files=str(data))
    return TextDataModule(dataset_managers={"train": {"notes": source}}, cache_dir=str(cache_dir), max_seq_len=32,
                          batch_size=4, **kwargs)


def notes(dm: TextDataModule) -> LocalDatasetManager:
    return dm.dataset_managers["train"]["notes"]


def cached_texts(dm: TextDataModule, cache_dir: Path) -> list[str]:
    return [TOKENIZER.decode(ids) for ids in notes(dm).setup(TOKENIZER, cache_dir)["input_ids"]]


def fit(dm: TextDataModule, steps: int = 2) -> Trainer:
    model = TinyCausalLM(vocab_size=dm.vocab_size, max_seq_len=32, d_model=16, n_layers=1, n_heads=2)
    trainer = Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(model, datamodule=dm)
    return trainer


def flip_middle_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def cache_log(caplog):
    caplog.set_level(logging.INFO, logger="lightning_tune_data.cache.store")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "lightning_tune_data.cache.store"]


def test_a_bit_flipped_in_a_cache_file_is_found_by_prepare_data_and_rebuilt_with_a_warning_naming_it(tmp_path):
    data, cache_dir = write_jsonl(tmp_path / "a.jsonl", TEXTS), tmp_path / "cache"
    dm = datamodule(data, cache_dir)
    dm.prepare_data()
    arrow = next((notes(dm).cache_dir_for(TOKENIZER, cache_dir) / "shards").rglob("*.arrow"))
    size = arrow.stat().st_size
    flip_middle_bit(arrow)  # same size: the sizes in the manifest cannot see it
    assert arrow.stat().st_size == size and cached_texts(dm, cache_dir) != TEXTS
    with pytest.warns(UserWarning, match=rf"Removing invalid cache .*\(corrupt: file .*{arrow.name} does not match "
                                         r"the checksum recorded when it was written"):
        trainer = fit(datamodule(data, cache_dir))
    assert trainer.global_step == 2
    assert cached_texts(dm, cache_dir) == TEXTS


def test_size_only_checks_are_a_datamodule_switch_that_skips_hashing(tmp_path, cache_log):
    data, cache_dir = write_jsonl(tmp_path / "a.jsonl", TEXTS), tmp_path / "cache"
    datamodule(data, cache_dir).prepare_data()
    datamodule(data, cache_dir, cache_verify="size").prepare_data()
    assert "sizes checked" in cache_log()[-1]
    with pytest.raises(ValueError, match=r"TextDataModule.cache_verify: 'fast' is not 'checksum' or 'size' or 'full'"):
        datamodule(data, cache_dir, cache_verify="fast")


def test_a_complete_cache_on_a_read_only_volume_trains_through_the_trainer(tmp_path):
    data, cache_dir = write_jsonl(tmp_path / "a.jsonl", TEXTS), tmp_path / "cache"
    datamodule(data, cache_dir).prepare_data()
    for lock in cache_dir.glob("*.lock"):
        lock.unlink()  # e.g. a cache copied into a container image or onto a shared dataset volume
    with read_only(cache_dir):
        dm = datamodule(data, cache_dir)
        assert fit(dm).global_step == 2
        assert cached_texts(dm, cache_dir) == TEXTS


def test_a_build_on_a_read_only_volume_fails_naming_the_directory_and_cache_dir(tmp_path):
    data, cache_dir = write_jsonl(tmp_path / "a.jsonl", TEXTS), tmp_path / "cache"
    cache_dir.mkdir()
    with read_only(cache_dir), pytest.raises(CacheReadOnlyError) as info:
        datamodule(data, cache_dir).prepare_data()
    message = str(info.value)
    assert message.startswith("source 'notes'") and f"cache directory {cache_dir} cannot be written" in message
    assert "Set the cache_dir option" in message


def test_touching_a_data_file_reuses_its_cache_and_an_edit_rebuilds_saying_which_file_changed(tmp_path, cache_log):
    data, cache_dir = write_jsonl(tmp_path / "a.jsonl", TEXTS), tmp_path / "cache"
    datamodule(data, cache_dir).prepare_data()
    assert "built cache" in cache_log()[-1] and "because no earlier build of this source" in cache_log()[-1]
    os.utime(data, ns=(1, 10**18))  # touch
    datamodule(data, cache_dir).prepare_data()
    assert "using cache" in cache_log()[-1]
    assert len([p for p in cache_dir.iterdir() if p.is_dir() and p.name.startswith("notes-")]) == 1
    write_jsonl(data, TEXTS[:-1])
    datamodule(data, cache_dir).prepare_data()
    line = cache_log()[-1]
    assert line.startswith("source 'notes'") and "built cache" in line
    assert "because data file a.jsonl changed (its content" in line and "since the build in notes-" in line


def test_a_build_names_the_changed_tokenizer_or_preprocessing(tmp_path, cache_log):
    data, cache_dir = write_jsonl(tmp_path / "a.jsonl", TEXTS), tmp_path / "cache"
    datamodule(data, cache_dir).prepare_data()
    source = LocalDatasetManager(data_files=str(data), preprocess_kwargs={"add_eos": False})
    TextDataModule(dataset_managers={"train": {"notes": source}}, cache_dir=str(cache_dir)).prepare_data()
    assert "because preprocess_kwargs changed ({} -> {'add_eos': False}) since the build in notes-" in cache_log()[-1]


def test_cache_folders_are_named_after_the_source_and_found_again_after_a_rename(tmp_path, cache_log):
    data, cache_dir = write_jsonl(tmp_path / "a.jsonl", TEXTS), tmp_path / "cache"
    datamodule(data, cache_dir).prepare_data()
    folders = [p.name for p in cache_dir.iterdir() if p.is_dir() and not p.name.startswith((".", "hf_"))]
    assert len(folders) == 1 and folders[0].startswith("notes-")
    renamed = TextDataModule(dataset_managers={"train": {"diary": LocalDatasetManager(data_files=str(data))}},
                             cache_dir=str(cache_dir))
    renamed.prepare_data()  # same content, another name: the existing cache is used
    assert "using cache" in cache_log()[-1] and folders[0] in cache_log()[-1]


def test_token_ids_past_the_vocabulary_fail_at_build_naming_source_id_and_tokenizer(tmp_path):
    data = write_jsonl(tmp_path / "a.jsonl", ["fine one", "fine two", "a BAD row", "fine three"])
    source = LocalDatasetManager(data_files=str(data), preprocess_function="cache_fns.ids_past_the_vocabulary")
    dm = TextDataModule(dataset_managers={"train": {"notes": source}}, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(PreprocessError) as info:
        dm.prepare_data()
    message = str(info.value)
    assert message.startswith("source 'notes'")
    assert f"token id {TOKENIZER.vocab_size} (row 2) is outside the tokenizer's vocabulary" in message
    assert f"vocab_size={TOKENIZER.vocab_size}" in message and "ByteTokenizer" in message
    assert not any(p.is_dir() and p.name.startswith("notes-") for p in (tmp_path / "cache").iterdir())


@pytest.mark.timeout(300)
def test_a_cli_fit_prints_one_line_per_cache_build_and_hit(tmp_path):
    data = write_jsonl(tmp_path / "a.jsonl", TEXTS)
    config = tmp_path / "fit.yaml"
    config.write_text(textwrap.dedent(f"""
        trainer: {{accelerator: cpu, max_steps: 1, logger: false, enable_checkpointing: false,
                  enable_progress_bar: false, enable_model_summary: false, default_root_dir: {tmp_path}}}
        model:
          class_path: lightning_tune_data.models.TinyCausalLM
          init_args: {{d_model: 16, n_layers: 1, n_heads: 2}}
        data:
          max_seq_len: 32
          batch_size: 2
          cache_dir: {tmp_path / "cache"}
          dataset_managers:
            train:
              notes:
                class_path: lightning_tune_data.LocalDatasetManager
                init_args: {{data_files: {data}}}
        """))
    command = [sys.executable, "-m", "lightning_tune_data", "fit", "--config", str(config)]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    runs = [subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
            for _ in range(2)]
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    lines = [[line for line in (run.stdout + run.stderr).splitlines() if line.startswith("source 'notes'")]
             for run in runs]
    assert len(lines[0]) == 1 and "built cache" in lines[0][0]
    assert len(lines[1]) == 1 and "using cache" in lines[1][0]


def _parts(*files: dict, tokenizer: str = "T:v1", kwargs: dict | None = None, split: str = "train") -> dict:
    return {"source": {"split": split, "data_file_identities": list(files)}, "tokenizer": tokenizer,
            "preprocess": {"kwargs": kwargs or {}, "function": {"qualname": "f"}}}


def _identity(path: str, size: int, digest: str) -> dict:
    return {"path": path, "size": size, "xxh3_128": digest}


def test_describe_changes_names_files_tokenizer_preprocessing_source_options_and_version():
    old = {"package_version": "1", "parts": _parts(_identity("/d/a.jsonl", 3, "x"), _identity("/d/b.jsonl", 1, "y"))}
    new = {"package_version": "2", "parts": _parts(_identity("/d/a.jsonl", 4, "z"), _identity("/d/c.jsonl", 1, "w"),
                                                   tokenizer="T:v2", kwargs={"add_eos": False}, split="val")}
    assert describe_changes(old, new) == [
        "the package version changed (1 -> 2)",
        "data file a.jsonl changed (its content, 3 -> 4 bytes)",
        "data file b.jsonl was removed",
        "data file c.jsonl was added",
        "the tokenizer changed",
        "preprocess_kwargs changed ({} -> {'add_eos': False})",
        "split changed ('train' -> 'val')",
    ]
    assert describe_changes(old, old) == ["its inputs differ from the previous build"]


def test_recorded_data_files_include_the_files_of_a_local_dataset_folder():
    parts = {"source": {"data_file_identities": [_identity("/d/a", 1, "x")],
                        "local_folder": [["/d/folder"], _identity("/d/folder/b", 2, "y")]}}
    assert list(recorded_data_files(parts)) == ["/d/a", "/d/folder/b"]
    assert recorded_data_files({}) == {}


def _marker(folder: Path, inputs: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / COMPLETE_MARKER).write_text(json.dumps({"cache_format": CACHE_FORMAT_VERSION, "inputs": inputs}))
    return folder


def test_rebuild_reason_compares_with_the_newest_other_build_of_the_same_source(tmp_path):
    inputs = {"source_key": "notes", "package_version": "1", "parts": _parts(_identity("/d/a.jsonl", 3, "x"))}
    assert rebuild_reason(tmp_path, inputs, tmp_path / "notes-new") == "no earlier build of this source"
    old = _marker(tmp_path / "notes-old", {**inputs, "parts": _parts(_identity("/d/a.jsonl", 2, "w"))})
    _marker(tmp_path / "wiki-1", {**inputs, "source_key": "wiki"})
    assert previous_build(tmp_path, "notes", exclude=tmp_path / "notes-new")["path"] == old
    assert previous_build(tmp_path, "notes", exclude=old) is None
    reason = rebuild_reason(tmp_path, inputs, tmp_path / "notes-new")
    assert reason.startswith("data file a.jsonl changed (its content, 2 -> 3 bytes) since the build in notes-old (")
    other_files = {**inputs, "parts": _parts(_identity("/other/b.jsonl", 3, "x"))}
    assert rebuild_reason(tmp_path, other_files, tmp_path / "notes-new") == "no earlier build of this source"


def test_changed_data_file_compares_the_recorded_content_hash(tmp_path):
    data = tmp_path / "a.jsonl"
    data.write_text("one\n")
    parts = _parts(file_identity(data))
    assert changed_data_file(parts, tmp_path) is None
    data.write_text("two\n")
    assert changed_data_file(parts, tmp_path) == "data file a.jsonl changed since the build"
    data.unlink()
    assert changed_data_file(parts, tmp_path) == f"data file {data.resolve()} is gone"
