"""The train loader's states with real dataloader workers: recorded by reference after every batch,
built on demand into exactly the states torchdata's ``StatefulDataLoader`` builds, and resumable."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_tune_data.collate import PackedCollator
from lightning_tune_data.loading.resumable_loader import LOADER_KEY, ResumableLoader
from lightning_tune_data.loading.worker_states import TrainDataLoader
from lightning_tune_data.packing.packer import IterablePackedDataset
from lightning_tune_data.sources.memory import InMemoryStream

BATCHES = 10


def packed_stream() -> IterablePackedDataset:
    rng = np.random.default_rng(3)
    documents = [{"input_ids": rng.integers(0, 300, size=int(rng.integers(1, 40))).astype(np.int32)}
                 for _ in range(200)]
    return IterablePackedDataset(InMemoryStream(documents, "m", seed=1), 48, strategy="best_fit", buffer_size=4)


def loader(cls: type, state: dict | None = None) -> StatefulDataLoader:
    made = cls(packed_stream(), batch_size=3, num_workers=2, collate_fn=PackedCollator(pad_id=0, max_seq_len=48),
               snapshot_every_n_steps=1, in_order=True, drop_last=True, generator=torch.Generator().manual_seed(5))
    if state is not None:
        made.load_state_dict(state)
    return made


def batches_and_states(made: StatefulDataLoader, count: int) -> tuple[list[dict], list[dict]]:
    iterator, batches, states = iter(made), [], []
    for _ in range(count):
        batches.append(next(iterator))
        states.append(made.state_dict())
    made._iterator._shutdown_workers()
    return batches, states


def assert_same_batches(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])
        assert a["provenance"] == b["provenance"]


@pytest.mark.slow
def test_the_states_built_on_demand_are_the_states_torchdata_builds_after_every_batch() -> None:
    ours, our_states = batches_and_states(loader(TrainDataLoader), BATCHES)
    theirs, their_states = batches_and_states(loader(StatefulDataLoader), BATCHES)
    assert_same_batches(ours, theirs)
    assert our_states == their_states


@pytest.mark.slow
def test_states_recorded_by_reference_keep_their_moment_and_resume_exactly() -> None:
    made = loader(TrainDataLoader)
    resumable = ResumableLoader(made, history=BATCHES + 1)
    iterator = iter(resumable)
    reference = [next(iterator) for _ in range(BATCHES)]
    states = [resumable.state_after(count) for count in range(1, BATCHES + 1)]  # built after all batches
    made._iterator._shutdown_workers()
    _, expected = batches_and_states(loader(StatefulDataLoader), BATCHES)
    assert [state[LOADER_KEY] for state in states] == expected  # nothing later leaked into an older state
    for count in (3, 7):
        resumed = ResumableLoader(loader(TrainDataLoader))
        resumed.restore(states[count - 1], count)
        again = iter(resumed)
        assert_same_batches([next(again) for _ in range(BATCHES - count)], reference[count:])
        resumed.loader._iterator._shutdown_workers()


@pytest.mark.slow
@pytest.mark.parametrize("compact", [False, True])
def test_batches_from_workers_are_the_iterators_own_with_tensors_and_the_end_of_a_finite_stream(compact) -> None:
    documents = [{"input_ids": np.arange(1, 6, dtype=np.int32) + i} for i in range(12)]
    stream = IterablePackedDataset(InMemoryStream(documents, "m", seed=1, num_passes=1), 16, strategy="greedy")
    made = TrainDataLoader(stream, batch_size=2, num_workers=2, collate_fn=PackedCollator(0, 16, compact=compact),
                           snapshot_every_n_steps=1, in_order=True, drop_last=False)
    got = list(ResumableLoader(made))
    assert got and all(isinstance(batch["input_ids"], torch.Tensor) for batch in got)
    assert ("compact_layout" in got[0]) == compact
    assert sum(len(batch["provenance"]["source"]) for batch in got) == 12  # every document, then the end
    assert made._iterator is None or made._iterator._finished
