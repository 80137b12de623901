"""``lightning-tune-data cache list|clean`` over real caches built by ``prepare_data``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from conftest import make_texts, write_jsonl

from lightning_tune_data import ByteTokenizer, LocalDatasetManager, TextDataModule
from lightning_tune_data.commands.cache import main, scan

REPO_ROOT = Path(__file__).resolve().parents[2]


def prepare(data: Path, cache_dir: Path, name: str = "notes", **kwargs) -> None:
    source = LocalDatasetManager(data_files=str(data), **kwargs)
    TextDataModule(dataset_managers={"train": {name: source}}, cache_dir=str(cache_dir)).prepare_data()


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "lightning_tune_data", "cache", *args], env=env,
                          capture_output=True, text=True, timeout=120, check=True)


def test_list_shows_size_source_and_which_caches_are_stale(tmp_path):
    cache_dir = tmp_path / "cache"
    notes = write_jsonl(tmp_path / "notes.jsonl", make_texts(50, seed=1))
    prepare(notes, cache_dir)
    prepare(write_jsonl(tmp_path / "web.jsonl", make_texts(20, seed=2)), cache_dir, name="web")
    prepare(notes, cache_dir, preprocess_kwargs={"add_eos": False})  # another config of notes: not stale
    write_jsonl(notes, make_texts(40, seed=1))
    prepare(notes, cache_dir)  # the two earlier notes caches now describe an old file
    (cache_dir / "half-built-0123456789abcdef").mkdir()  # an interrupted build (no marker)
    assert not (cache_dir / "hf_datasets").exists()  # datasets' conversions go when each store is written
    (cache_dir / "hf_datasets" / "json").mkdir(parents=True)  # as an earlier version left them
    (cache_dir / "hf_datasets" / "json" / "data.arrow").write_bytes(b"x" * 10)

    output = cli("list", "--cache_dir", str(cache_dir)).stdout
    rows = {line.split()[0]: line for line in output.splitlines() if line.startswith(("notes-", "web-", "half-"))}
    assert len(rows) == 5, output
    stale = {name for name, line in rows.items() if "stale:" in line}
    assert len(stale) == 3 and any(n.startswith("half-") for n in stale)
    assert all("data file notes.jsonl changed since the build" in rows[n] for n in stale if n.startswith("notes-"))
    assert sum(1 for n in rows if n.startswith("notes-") and n not in stale) == 1
    assert "ok" in next(line for n, line in rows.items() if n.startswith("web-"))
    assert all(" KB" in line for line in rows.values() if not line.startswith("half-"))
    assert "hf_datasets" in output and "intermediate files of the datasets library" in output
    assert "4 stale" in output and "cache clean" in output  # 3 caches + the datasets library's files


def test_clean_removes_only_stale_caches_and_dry_run_removes_nothing(tmp_path):
    cache_dir = tmp_path / "cache"
    notes = write_jsonl(tmp_path / "notes.jsonl", make_texts(50, seed=1))
    prepare(notes, cache_dir)
    write_jsonl(notes, make_texts(45, seed=1))
    prepare(notes, cache_dir)
    before = {e.path.name for e in scan(cache_dir)}

    dry = cli("clean", "--cache_dir", str(cache_dir), "--dry-run").stdout
    assert "Would remove" in dry and {e.path.name for e in scan(cache_dir)} == before

    cli("clean", "--cache_dir", str(cache_dir))
    left = scan(cache_dir)
    assert all(entry.stale is None for entry in left)
    usable = [e for e in left if e.path.name.startswith("notes-")]
    assert len(usable) == 1
    texts = LocalDatasetManager(data_files=str(notes))
    texts.source_name = "notes"
    assert len(texts.setup(ByteTokenizer(), cache_dir)) == 45  # the current cache still works

    cli("clean", "--cache_dir", str(cache_dir), "--all")
    assert scan(cache_dir) == []


def test_scan_reports_leftovers_of_interrupted_builds_and_another_version_as_stale(tmp_path):
    cache_dir = tmp_path / "cache"
    (cache_dir / ".notes-1.tmp-12-abc").mkdir(parents=True)
    (cache_dir / "gone-2.lock").write_text("")
    (cache_dir / ".file-hashes.json").write_text("{}")  # the hash memo is not an entry
    old = cache_dir / "old-3"
    old.mkdir()
    (old / "_COMPLETE.json").write_text(json.dumps({"cache_format": 1}))
    entries = {entry.path.name: entry for entry in scan(cache_dir)}
    assert set(entries) == {".notes-1.tmp-12-abc", "gone-2.lock", "old-3"}
    assert entries[".notes-1.tmp-12-abc"].stale == "leftover temporary folder of an interrupted build"
    assert entries["gone-2.lock"].stale == "lock file without a cache"
    assert entries["old-3"].stale == "written by another version of the package"
    lock_row = entries["gone-2.lock"].row()
    assert (lock_row[1], lock_row[2], lock_row[-1]) == ("0 B", "?", "stale: lock file without a cache")
    assert scan(tmp_path / "missing") == []


def test_list_tells_apart_same_named_train_and_val_caches_and_offers_no_clean_when_nothing_is_stale(tmp_path, capsys):
    cache_dir = tmp_path / "cache"
    train = write_jsonl(tmp_path / "arithmetic_train.jsonl", make_texts(30, seed=1))
    val = write_jsonl(tmp_path / "arithmetic_val.jsonl", make_texts(10, seed=2))
    TextDataModule(dataset_managers={"train": {"arithmetic": LocalDatasetManager(data_files=str(train))},
                                     "val": {"arithmetic": LocalDatasetManager(data_files=str(val))}},
                   cache_dir=str(cache_dir)).prepare_data()
    for entry in scan(cache_dir):
        if entry.path.name == "hf_datasets":
            shutil.rmtree(entry.path)  # the datasets library's intermediate files: always stale

    assert main(["list", "--cache_dir", str(cache_dir)]) == 0
    output = capsys.readouterr().out
    rows = [line for line in output.splitlines() if line.startswith("arithmetic-")]
    assert len(rows) == 2
    assert sorted("arithmetic_train.jsonl" in row for row in rows) == [False, True]
    assert sorted("arithmetic_val.jsonl" in row for row in rows) == [False, True]
    assert output.splitlines()[0].split() == ["CACHE", "SIZE", "SOURCE", "DATA", "BUILT", "STATUS"]
    assert output.rstrip().endswith("nothing stale.")
    assert "0 stale" not in output and "cache clean" not in output


def test_a_node_shard_cache_is_listed_per_store_kept_by_clean_and_removed_by_clean_all(tmp_path):
    node = tmp_path / "node"
    shard = node / "shard-cache" / "notes-0123456789abcdef" / "shards" / "task-00000-of-00001" / "00000.arrow"
    shard.parent.mkdir(parents=True)
    shard.write_bytes(b"x" * 2000)
    [entry] = scan(node)
    assert (entry.path.name, entry.source, entry.stale, entry.size) == ("notes-0123456789abcdef", "(node shard cache)",
                                                                        None, 2000)
    assert "(node shard cache)" in cli("list", "--cache_dir", str(node)).stdout
    cli("clean", "--cache_dir", str(node))
    assert shard.exists()
    cli("clean", "--cache_dir", str(node), "--all")
    assert not shard.exists() and scan(node) == []


def test_clean_keeps_a_store_whose_tasks_are_alive_and_clean_store_removes_exactly_one(tmp_path):
    from lightning_tune_data.managers.store_task import run_store_task

    cache_dir = tmp_path / "cache"
    prepare(write_jsonl(tmp_path / "web.jsonl", make_texts(20, seed=2)), cache_dir, name="web")
    source = LocalDatasetManager(data_files=str(write_jsonl(tmp_path / "notes.jsonl", make_texts(30, seed=1))))
    source.source_name = "notes"
    run_store_task(source, ByteTokenizer(), cache_dir, 0, 3)  # tasks 1 and 2 still queued in a job array
    [partial] = [p.name for p in cache_dir.glob("notes-*")]
    listing = cli("list", "--cache_dir", str(cache_dir)).stdout
    assert "not committed: tasks 1, 2 of 3 unfinished, last task activity" in listing and "nothing stale" in listing
    [web] = [p.name for p in cache_dir.glob("web-*") if p.is_dir()]
    details = listing.splitlines()[listing.splitlines().index(next(l for l in listing.splitlines() if l.startswith(web))) + 1]
    assert details.startswith(f"    {cache_dir / web}  1 shards, largest ") and "tokenizer ByteTokenizer" in details
    assert "copies it whole, at least" in details and "reads it shard by shard" in details
    assert "Removed 0 of" in cli("clean", "--cache_dir", str(cache_dir)).stdout
    assert (cache_dir / partial).is_dir()
    assert "stale: not committed: tasks 1, 2 of 3 unfinished, no sign of life for" in cli(
        "list", "--cache_dir", str(cache_dir), "--stale-after", "0").stdout

    removed = cli("clean", "--cache_dir", str(cache_dir), "--store", partial).stdout
    assert f"Removed {partial} (" in removed and "Removed 1 of 1 entries" in removed
    assert not (cache_dir / partial).exists() and list(cache_dir.glob("web-*"))  # the other store untouched
    missing = subprocess.run([sys.executable, "-m", "lightning_tune_data", "cache", "clean", "--cache_dir",
                              str(cache_dir), "--store", partial], env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and f"No store {partial} in {cache_dir}" in missing.stdout


def test_cache_commands_read_cache_dir_and_storage_options_from_a_config(tmp_path, capsys):
    import yaml

    cache_dir = tmp_path / "cache"
    prepare(write_jsonl(tmp_path / "web.jsonl", make_texts(20, seed=2)), cache_dir, name="web")
    config = tmp_path / "cfg.yaml"
    config.write_text(yaml.safe_dump({"data": {"cache_dir": str(cache_dir), "storage_options": None}}))
    capsys.readouterr()
    assert main(["list", "--config", str(config)]) == 0
    assert f"in {cache_dir}; nothing stale." in capsys.readouterr().out
    assert main(["list", "--config", str(config), "--cache-dir", str(tmp_path / "elsewhere")]) == 0
    assert capsys.readouterr().out.strip() == f"No caches in {tmp_path / 'elsewhere'}."  # the flag wins
