"""``cache verify`` re-hashes every committed store and names a corrupt file, even one whose
modification time was kept (what opening a store cannot see)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import flip_keeping_stamp, make_texts, write_jsonl
from test_cache import REPO_ROOT, prepare


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "lightning_tune_data", "cache", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_verify_rehashes_every_store_and_names_a_corrupt_shard(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    prepare(write_jsonl(tmp_path / "a.jsonl", make_texts(20, seed=1)), cache_dir, name="notes")
    prepare(write_jsonl(tmp_path / "b.jsonl", make_texts(20, seed=2)), cache_dir, name="other")
    result = cli("verify", "--cache-dir", str(cache_dir))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(": ok") == 2 and "Verified 2 stores" in result.stdout and "0 corrupt" in result.stdout
    shard = next((cache_dir).glob("notes-*/shards/*/*.arrow"))
    flip_keeping_stamp(shard)
    result = cli("verify", "--cache-dir", str(cache_dir), "--source", "notes")
    assert result.returncode == 1
    assert f"CORRUPT: file {shard} does not match the checksum recorded when it was written" in result.stdout
    assert "Verified 1 stores" in result.stdout and "1 corrupt" in result.stdout


def test_list_clean_and_verify_work_on_a_remote_root(tmp_path: Path, s3, capsys) -> None:
    import json

    from lightning_tune_data import LocalDatasetManager, TextDataModule
    from lightning_tune_data.commands.cache import main
    from lightning_tune_data.managers.store_task import run_store_task
    from lightning_tune_data.tokenizers import ByteTokenizer

    def datamodule(name: str, seed: int) -> TextDataModule:
        source = LocalDatasetManager(data_files=str(write_jsonl(tmp_path / f"{name}.jsonl", make_texts(20, seed=seed))))
        return TextDataModule(dataset_managers={"train": {name: source}}, cache_dir=s3.url,
                              storage_options=s3.storage_options, local_cache_dir=str(tmp_path / "node"), build_stores="if_missing")

    datamodule("notes", 1).prepare_data()  # built here and uploaded
    partial = datamodule("draft", 2)
    run_store_task(partial.dataset_managers["train"]["draft"], ByteTokenizer(), partial.store_root, 0, 2)
    options = ["--cache-dir", s3.url, "--storage-options", json.dumps(s3.storage_options)]

    assert main(["list", *options]) == 0
    listing = capsys.readouterr().out
    assert "notes" in listing and "20 rows" in listing and "committed" in listing
    # task 0 finished a moment ago: the store is being written (task 1 may be queued), not stale
    assert "draft" in listing and "not committed: task 1 of 2 unfinished, last task activity" in listing
    assert "; 0 stale." in listing and "stale: not committed" not in listing
    assert f"    {s3.url}/notes-" in listing and "1 shards, largest" in listing  # where a training job finds it

    assert main(["verify", *options]) == 0
    assert "Verified 1 stores" in capsys.readouterr().out
    shard = next(key for key in s3.keys() if key.startswith("notes-") and key.endswith(".arrow"))
    data = bytearray(s3.get(shard))
    data[len(data) // 2] ^= 0x01
    s3.put(shard, bytes(data))
    assert main(["verify", *options]) == 1
    assert f"CORRUPT: s3://{s3.bucket}/{s3.prefix}/{shard} does not match the checksum" in capsys.readouterr().out

    assert main(["clean", *options]) == 0
    assert "Removed 0 of 2 stores" in capsys.readouterr().out  # nothing stale yet
    assert main(["clean", *options, "--stale-after", "0"]) == 0  # no sign of life for 0 hours: stale
    assert "Removed 1 of 2 stores" in capsys.readouterr().out
    assert not [key for key in s3.keys() if key.startswith("draft-")] and [k for k in s3.keys() if k.startswith("notes-")]
