"""TextDataModule: its lifecycle (prepare, setup, loaders) and its train data state in checkpoints.

The parts it is composed of have their own tests: config checks (test_validation.py), split and
dataloader names (test_splits.py), the managers' data (test_manager_data.py), the train stream
(test_train_stream.py), the eval loaders (test_eval_loaders.py), stage checks (test_stage_checks.py).
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
from datamodule_config import managers, ready
from lightning.pytorch.trainer.states import TrainerFn
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_tune_data import TextDataModule
from lightning_tune_data.loading.checkpoint import (
    BATCHES_CONSUMED_KEY,
    LOADER_STATE_KEY,
    RANKS_KEY,
    SIGNATURE_KEY,
    STATE_VERSION,
    VERSION_KEY,
)
from lightning_tune_data.loading.resumable_loader import ResumableLoader


def test_train_loader_is_a_resumable_stateful_dataloader_with_drop_last(corpus_dir, tmp_path):
    datamodule = ready(TextDataModule(dataset_managers=managers(corpus_dir), cache_dir=str(tmp_path), batch_size=4))
    loader = datamodule.train_dataloader()
    assert isinstance(loader, ResumableLoader)
    assert isinstance(loader.loader, StatefulDataLoader)
    assert loader.loader.drop_last
    assert not hasattr(loader, "state_dict"), "Lightning must not save the (prefetched) loader state itself"
    batch = next(iter(loader))
    assert batch["input_ids"].shape[0] == 4 and batch["input_ids"].dtype == torch.long
    assert set(batch["provenance"]["source"]) <= {"a", "b"}


def test_teardown_stops_the_train_loaders_worker_processes_outside_a_trainer(corpus_dir, tmp_path):
    datamodule = ready(TextDataModule(dataset_managers=managers(corpus_dir), cache_dir=str(tmp_path), batch_size=4,
                                      num_workers=2, persistent_workers=True))
    loader = datamodule.train_dataloader()
    next(iter(loader))
    workers = list(loader.loader._iterator._workers)
    assert len(workers) == 2 and all(worker.is_alive() for worker in workers)
    datamodule.teardown("fit")
    for worker in workers:
        worker.join(timeout=10)
    assert not any(worker.is_alive() for worker in workers)
    assert next(iter(loader))["input_ids"].shape[0] == 4, "the loader starts new workers when iterated again"
    datamodule.teardown("fit")


def test_finite_first_exhausted_mix_ends_the_epoch(corpus_dir, tmp_path):
    config = managers(corpus_dir)
    datamodule = ready(
        TextDataModule(dataset_managers=config, cache_dir=str(tmp_path), batch_size=4, multidataset_stopping_strategy="first_exhausted")
    )
    batches = list(datamodule.train_dataloader())
    counts = {"a": 0, "b": 0}
    for batch in batches:
        for source in batch["provenance"]["source"]:
            counts[source] += 1
    assert counts["a"] <= 61 and counts["b"] <= 47
    # The stream stopped because one source ran out: that source is complete up to the at most
    # batch_size - 1 documents that drop_last removed from the final partial batch.
    assert counts["a"] >= 61 - 3 or counts["b"] >= 47 - 3
    assert 0 < len(batches) < (61 + 47) // 4


def test_overlong_documents_are_warned_about_once_unless_the_packer_splits_them(corpus_dir, tmp_path):
    def setup_warnings(**options) -> list[str]:
        datamodule = TextDataModule(dataset_managers=managers(corpus_dir), cache_dir=str(tmp_path), max_seq_len=16,
                                    **options)
        datamodule.prepare_data()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            datamodule.setup("fit")
            datamodule.setup("fit")
        return [str(w.message) for w in caught if "longer than max_seq_len" in str(w.message)]

    truncated = setup_warnings()
    assert len(truncated) == 2 and {line.split(":")[0] for line in truncated} == {"Train source 'a'", "Train source 'b'"}
    assert setup_warnings(packing="greedy") == truncated
    assert setup_warnings(packing="concat") == []


def test_state_dict_is_the_checkpoint_layout_and_round_trips_into_a_new_datamodule(corpus_dir, tmp_path):
    def datamodule() -> TextDataModule:
        return ready(TextDataModule(dataset_managers=managers(corpus_dir), cache_dir=str(tmp_path), batch_size=4))

    first = datamodule()
    assert first.state_dict() == {}  # no train loader yet: nothing to save
    batches = iter(first.train_dataloader())
    for _ in range(3):
        next(batches)
    state = first.state_dict()
    assert state[VERSION_KEY] == STATE_VERSION and state[SIGNATURE_KEY] == first.data_signature()
    assert [entry[BATCHES_CONSUMED_KEY] for entry in state[RANKS_KEY]] == [3]
    assert set(state[RANKS_KEY][0][LOADER_STATE_KEY]) == {"dataset", "epoch"}
    expected = next(batches)
    resumed = datamodule()
    resumed.load_state_dict(state)
    assert resumed.state_dict() is state  # held until the train loader exists
    assert torch.equal(next(iter(resumed.train_dataloader()))["input_ids"], expected["input_ids"])


def test_a_checkpoints_data_state_is_ignored_when_opted_out_or_evaluating(corpus_dir, tmp_path):
    saved = {VERSION_KEY: 1}  # would fail if it were read
    opted_out = TextDataModule(dataset_managers=managers(corpus_dir), resume_data_state=False)
    with pytest.warns(UserWarning, match="resume_data_state=False: the checkpoint's train data position is ignored"):
        opted_out.load_state_dict(saved)
    evaluating = TextDataModule(dataset_managers=managers(corpus_dir))
    evaluating.trainer = SimpleNamespace(state=SimpleNamespace(fn=TrainerFn.VALIDATING))
    evaluating.load_state_dict(saved)
    for datamodule in (opted_out, evaluating):
        assert datamodule.state_dict() == {}
    with pytest.raises(ValueError, match="train data state has version 1"):
        TextDataModule(dataset_managers=managers(corpus_dir)).load_state_dict(saved)


def test_without_a_val_split_there_are_no_val_loaders(corpus_dir, tmp_path):
    datamodule = ready(TextDataModule(dataset_managers={"train": managers(corpus_dir)["train"]}, cache_dir=str(tmp_path)))
    assert datamodule.val_dataloader() == []
