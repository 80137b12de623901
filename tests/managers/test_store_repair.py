"""Repairing a committed store: every file verified, only the tasks whose files fail redone, the
same commit written again, other stores untouched."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_texts, write_jsonl

from lightning_tune_data.cache.marker import COMPLETE_MARKER
from lightning_tune_data.cache.tasks import StoreNotCommittedError
from lightning_tune_data.managers import LocalDatasetManager
from lightning_tune_data.managers.store_repair import repair_source_store
from lightning_tune_data.managers.store_task import run_store_task
from lightning_tune_data.tokenizers import ByteTokenizer

TOK = ByteTokenizer()


def source(tmp_path: Path, name: str, seed: int) -> LocalDatasetManager:
    paths = [str(write_jsonl(tmp_path / "data" / f"{name}-{i}.jsonl", make_texts(12, seed=seed + i))) for i in range(2)]
    manager = LocalDatasetManager(data_files=paths)
    manager.source_name = name
    return manager


def stamps(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


def test_repair_redoes_only_the_task_of_a_damaged_shard_and_writes_the_same_commit(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    notes, web = source(tmp_path, "notes", 1), source(tmp_path, "web", 9)
    for manager in (notes, web):
        for index in range(2):
            run_store_task(manager, TOK, cache, index, 2)
    store, other = Path(notes.cache_dir_for(TOK, cache)), Path(web.cache_dir_for(TOK, cache))
    assert repair_source_store(notes, TOK, cache).startswith("intact (")
    commit = (store / COMPLETE_MARKER).read_bytes()
    [damaged] = sorted(store.glob("shards/task-00001-of-00002/*.arrow"))[:1]
    original = damaged.read_bytes()
    flipped = bytearray(original)
    flipped[len(flipped) // 2] ^= 0x01
    damaged.write_bytes(bytes(flipped))
    before, untouched = stamps(store), stamps(other)

    status = repair_source_store(notes, TOK, cache)
    relative = str(damaged.relative_to(store))
    assert status == f"repaired: task 1 of 2 redone (1 file rewritten: {relative})"
    assert damaged.read_bytes() == original and (store / COMPLETE_MARKER).read_bytes() == commit
    after = stamps(store)
    assert {p for p in before if before[p] != after[p]} <= {relative, COMPLETE_MARKER}  # task 0 untouched
    assert stamps(other) == untouched  # another store untouched
    assert repair_source_store(notes, TOK, cache).startswith("intact (")


def test_repair_refuses_an_uncommitted_store_and_restores_a_deleted_shard(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    notes = source(tmp_path, "notes", 1)
    with pytest.raises(StoreNotCommittedError, match=r"no committed store at .* to repair; run lightning-tune-data "
                                                     r"prepare without --repair"):
        repair_source_store(notes, TOK, cache)
    for index in range(2):
        run_store_task(notes, TOK, cache, index, 2)
    store = Path(notes.cache_dir_for(TOK, cache))
    [shard] = sorted(store.glob("shards/task-00000-of-00002/*.arrow"))[:1]
    shard.unlink()  # an object deleted from storage
    assert repair_source_store(notes, TOK, cache).startswith("repaired: task 0 of 2 redone")
    assert shard.is_file() and notes.setup(TOK, cache)["input_ids"]
