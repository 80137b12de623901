"""The resumable train loader: its state after every batch it hands out, so the saved state is the one
after the last batch the model consumed, and the same batches as the ``StatefulDataLoader`` it wraps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_tune_data import LocalDatasetManager, TextDataModule
from lightning_tune_data.collate import PaddedCollator
from lightning_tune_data.loading.resumable_loader import DATASET_KEY, EPOCH_KEY, LOADER_KEY, ResumableLoader
from lightning_tune_data.sources.memory import InMemoryStream


def _finite_train_loader(corpus_dir: Path, tmp_path: Path) -> ResumableLoader:
    train = {name: LocalDatasetManager(data_files=str(corpus_dir / f"{name}.jsonl"), weight=weight)
             for name, weight in (("a", 3.0), ("b", 1.0))}
    datamodule = TextDataModule(dataset_managers={"train": train}, cache_dir=str(tmp_path), batch_size=4,
                                multidataset_stopping_strategy="first_exhausted")
    datamodule.prepare_data()
    datamodule.setup("fit")
    return datamodule.train_dataloader()


def assert_same_batches(got: list[dict], expected: list[dict]) -> None:
    assert len(got) == len(expected) > 0
    for batch, reference in zip(got, expected):
        assert batch.keys() == reference.keys()
        for key, value in reference.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(batch[key], value), key
            else:
                assert batch[key] == value, key


def test_in_process_train_loader_hands_out_the_stateful_dataloaders_own_batches(corpus_dir, tmp_path):
    # The in-process loader takes each batch from the StatefulDataLoader's iterator without its
    # per-batch profiler range: the same batches, the same end (drop_last), the same random draws.
    torch.manual_seed(0)
    direct = list(_finite_train_loader(corpus_dir, tmp_path / "direct").loader)
    rng_after_direct = torch.get_rng_state()
    torch.manual_seed(0)
    resumable = _finite_train_loader(corpus_dir, tmp_path / "resumable")
    assert_same_batches(list(resumable), direct)
    assert torch.equal(torch.get_rng_state(), rng_after_direct)
    assert resumable.batches_yielded == len(direct)


def test_train_loader_under_a_profiler_records_its_batches_and_hands_out_the_same_ones(corpus_dir, tmp_path):
    expected = list(_finite_train_loader(corpus_dir, tmp_path / "plain"))
    loader = _finite_train_loader(corpus_dir, tmp_path / "profiled")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        got = list(loader)
    assert_same_batches(got, expected)
    ranges = [event.name for event in profiler.events() if event.name.startswith("enumerate(DataLoader)")]
    assert len(ranges) >= len(expected)


def stream_loader(num_workers: int = 0, history: int = 8) -> ResumableLoader:
    stream = InMemoryStream([[i] * (1 + i % 4) for i in range(40)], "docs", seed=1, num_passes=1)
    loader = StatefulDataLoader(stream, batch_size=3, num_workers=num_workers, collate_fn=PaddedCollator(pad_id=0),
                                snapshot_every_n_steps=1, drop_last=True)
    return ResumableLoader(loader, history=history)


def test_the_state_after_a_batch_restores_the_batches_after_it():
    loader = stream_loader()
    batches = iter(loader)
    for _ in range(4):
        next(batches)
    after_two = loader.state_after(2)
    assert set(after_two) == {DATASET_KEY, EPOCH_KEY} and after_two[EPOCH_KEY] == 0
    rest = [batch["input_ids"] for batch in batches]
    resumed = stream_loader()
    resumed.restore(after_two, 2)
    assert resumed.batches_yielded == 2
    again = [batch["input_ids"] for batch in resumed]
    assert len(again) == len(rest) + 2
    assert all(torch.equal(a, b) for a, b in zip(again[2:], rest, strict=True))
    assert resumed.epoch == 1 and resumed.batches_yielded == 13  # 40 documents: 13 full batches of 3


def test_with_workers_the_state_is_the_stateful_dataloaders_own():
    loader = stream_loader(num_workers=1)
    batches = iter(loader)
    next(batches)
    state = loader.state_after(1)
    assert set(state) == {LOADER_KEY, EPOCH_KEY}
    loader._iterator = None  # Lightning's teardown: the worker stops
    assert loader.loader._iterator is None


def test_before_any_batch_the_state_is_taken_on_demand():
    loader = stream_loader()
    assert set(loader.state_after(0)) == {DATASET_KEY, EPOCH_KEY}


def test_a_state_older_than_the_kept_history_is_an_error_naming_what_is_kept():
    loader = stream_loader(history=2)
    batches = iter(loader)
    for _ in range(4):
        next(batches)
    with pytest.raises(RuntimeError, match=r"^No train loader state recorded after batch 1 \(the loader handed out 4; "
                                           r"states kept after batches \[3, 4\]\)"):
        loader.state_after(1)


def test_lightning_cannot_save_or_restore_the_prefetched_state_itself():
    loader = stream_loader()
    assert not hasattr(loader, "state_dict") and not hasattr(loader, "load_state_dict")
    assert loader.batch_size == 3 and isinstance(loader.dataset, InMemoryStream)
