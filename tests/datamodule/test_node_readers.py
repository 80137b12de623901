"""How many processes of a node read each train store (what a budgeted store's windows are sized for)."""

from __future__ import annotations

from types import SimpleNamespace

from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.datamodule.node_readers import local_ranks, node_readers, node_root


def test_readers_are_the_local_ranks_times_the_workers(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert node_readers(None, 0) == 1  # a rank without workers reads itself
    assert node_readers(None, 3) == 3
    assert node_readers(SimpleNamespace(num_devices=4), 2) == 8  # the trainer's devices on this node
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")  # torchrun without a trainer
    assert local_ranks() == 2 and node_readers(None, 2) == 4
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "not a number")
    assert local_ranks() == 1


def test_the_root_a_datamodule_sets_up_with_carries_its_readers_to_every_store(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    root = StoreRoot("s3://bucket/prefix", cache_budget=1 << 20)
    read = node_root(SimpleNamespace(trainer=SimpleNamespace(num_devices=2), num_workers=2), root)
    assert read.node_readers == 4 and root.node_readers == 1
    assert read.with_url("s3://bucket/other").node_readers == 4  # a source's own cache_dir
    assert read.shared_by(2).node_readers == 4
