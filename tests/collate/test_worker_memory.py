"""Batch tensors built in shared memory inside real dataloader worker processes.

A batch built in ordinary memory inside a worker is copied into shared memory by torch on its
way to the main process and its heap block freed; those per-batch blocks of varying size are
what made the workers' memory grow. These tests check, in real worker processes, that the
block is in shared memory from the start and that the batches stay exactly the same.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from lightning_tune_data.collate import ATTENTION_MASK, INPUT_IDS, LABELS, POSITION_IDS, PackedCollator, PaddedCollator
from lightning_tune_data.sources.memory import InMemoryStream
from lightning_tune_data.packing.packer import IterablePackedDataset
from lightning_tune_data.collate.worker_memory import batch_tensor

PAD = 7


class WorkerBuiltTensors(IterableDataset):
    """Each worker yields three tensors from ``batch_tensor``, filled with its id, and facts about them."""

    def __iter__(self):
        worker = get_worker_info()
        for step in range(3):
            tensor = batch_tensor((2, 3 + step), torch.int64)
            tensor.fill_(worker.id)
            yield {"tensor": tensor, "shared_in_worker": tensor.is_shared(), "pid": os.getpid(), "worker": worker.id}


def test_batch_tensor_in_the_main_process_is_ordinary_memory() -> None:
    tensor = batch_tensor((4, 5), torch.int32)

    assert tensor.shape == (4, 5)
    assert tensor.dtype == torch.int32
    assert not tensor.is_shared()


def test_batch_tensor_in_a_worker_is_built_in_shared_memory() -> None:
    loader = DataLoader(WorkerBuiltTensors(), batch_size=None, num_workers=2)

    items = list(loader)

    assert len(items) == 6
    assert {item["worker"] for item in items} == {0, 1}
    assert all(item["pid"] != os.getpid() for item in items)  # built in real worker processes
    assert all(item["shared_in_worker"] for item in items)
    for item in items:
        assert item["tensor"].dtype == torch.int64
        assert item["tensor"].shape[0] == 2
        assert torch.all(item["tensor"] == item["worker"])  # the values made it across intact


def doc(length: int, start: int) -> dict[str, Any]:
    return {"input_ids": np.arange(start, start + length, dtype=np.int32), "source": "web", "epoch": 0}


class RecordingCollate:
    """The padded collator, plus whether its block was in shared memory where it was built."""

    def __init__(self) -> None:
        self.collator = PaddedCollator(pad_id=PAD)

    def __call__(self, samples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.collator(samples)
        batch["built_in_shared_memory"] = batch[INPUT_IDS].is_shared()
        batch["built_in_pid"] = os.getpid()
        return batch


def test_padded_collator_builds_worker_batches_in_shared_memory_with_the_same_values() -> None:
    samples = [doc(length, 100 * i) for i, length in enumerate([3, 9, 1, 5, 12, 2, 7, 4])]
    reference = [PaddedCollator(pad_id=PAD)(samples[i : i + 4]) for i in (0, 4)]

    loader = DataLoader(samples, batch_size=4, num_workers=2, collate_fn=RecordingCollate())
    batches = list(loader)

    assert len(batches) == 2
    assert all(batch["built_in_pid"] != os.getpid() for batch in batches)
    assert all(batch["built_in_shared_memory"] for batch in batches)
    for batch, expected in zip(batches, reference):
        assert not expected[INPUT_IDS].is_shared()  # in-process collation keeps ordinary memory
        for key in (INPUT_IDS, LABELS, ATTENTION_MASK, POSITION_IDS):
            assert batch[key].dtype == torch.int64
            assert torch.equal(batch[key], expected[key])


class RecordingPackedCollate:
    """The packed collator, plus whether all its tensors were one shared-memory allocation."""

    def __init__(self) -> None:
        self.collator = PackedCollator(pad_id=PAD)

    def __call__(self, samples: list[Any]) -> dict[str, Any]:
        batch = self.collator(samples)
        tensors = [value for value in batch.values() if isinstance(value, torch.Tensor)]
        batch["one_shared_allocation"] = all(t.is_shared() for t in tensors) and len(
            {t.untyped_storage().data_ptr() for t in tensors}) == 1
        return batch


def test_packed_collator_sends_a_worker_batch_as_one_shared_allocation_with_the_same_values() -> None:
    documents = [doc(length, 100 * i) for i, length in enumerate([30, 9, 17, 5, 12, 25, 7, 40, 3, 11, 22, 6])]
    packs = list(IterablePackedDataset(InMemoryStream(documents, "web", shuffle=False, num_passes=1), 32,
                                       strategy="best_fit"))
    reference = [PackedCollator(pad_id=PAD)(packs[i : i + 2]) for i in range(0, len(packs), 2)]

    batches = list(DataLoader(packs, batch_size=2, num_workers=2, collate_fn=RecordingPackedCollate()))

    assert len(batches) == len(reference) >= 3
    assert all(batch["one_shared_allocation"] for batch in batches)  # seq_lens too: one segment per batch
    for batch, expected in zip(batches, reference):
        for key in (INPUT_IDS, LABELS, ATTENTION_MASK, POSITION_IDS, "document_ids", "seq_lens"):
            assert torch.equal(batch[key], expected[key])
        assert batch["provenance"] == expected["provenance"]
