"""The checkpoint layout of the train data state: written and read by one module, checked on resume."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_tune_data.collate import PaddedCollator
from lightning_tune_data.loading.checkpoint import (
    BATCHES_CONSUMED_KEY,
    LOADER_STATE_KEY,
    RANKS_KEY,
    RESUME_OPT_OUT,
    SIGNATURE_KEY,
    STATE_VERSION,
    VERSION_KEY,
    TrainResume,
    data_signature,
    data_state,
    old_shard_states,
    warn_data_state_ignored,
    warn_no_data_state,
)
from lightning_tune_data.loading.resumable_loader import DATASET_KEY, LOADER_KEY, ResumableLoader
from lightning_tune_data.sources.base import ElasticResumeUnsupported
from lightning_tune_data.sources.memory import InMemoryStream


def signature(**changes: Any) -> dict[str, Any]:
    values = {"sources": ["b", "a"], "weights": {"a": 0.75, "b": 0.25}, "mix_by": "documents", "seed": 1,
              "max_seq_len": 16, "batch_size": 3, "num_workers": 0, "world_size": 1, "packing": None,
              "stopping_strategy": "infinite", "train_mode": "stream"}
    return data_signature(**{**values, **changes})


def train_loader(num_workers: int = 0) -> ResumableLoader:
    stream = InMemoryStream([[i] * (1 + i % 4) for i in range(40)], "docs", seed=1)
    loader = StatefulDataLoader(stream, batch_size=3, num_workers=num_workers, collate_fn=PaddedCollator(pad_id=0),
                                snapshot_every_n_steps=1, drop_last=True)
    return ResumableLoader(loader)


def saved_after(batches: int, num_workers: int = 0, **changes: Any) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """The data state after ``batches`` batches, and the next three batches of the uninterrupted run."""
    loader = train_loader(num_workers)
    iterator = iter(loader)
    for _ in range(batches):
        next(iterator)
    state = copy.deepcopy(data_state(loader, batches, signature(**changes), world_size=1))
    following = [next(iterator)["input_ids"] for _ in range(3)]
    loader._iterator = None
    return state, following


def test_the_signature_holds_every_setting_a_position_depends_on():
    assert signature() == {"sources": ["a", "b"], "weights": {"a": 0.75, "b": 0.25}, "mix_by": "documents",
                           "seed": 1, "max_seq_len": 16, "batch_size": 3, "num_workers": 0, "world_size": 1,
                           "packing": None, "stopping_strategy": "infinite", "train_mode": "stream"}
    assert signature(weights={"a": 1 / 3})["weights"] == {"a": round(1 / 3, 12)}


def test_the_data_state_round_trips_through_accept_and_restore_to_the_same_next_batches():
    state, following = saved_after(4)
    assert state[VERSION_KEY] == STATE_VERSION and state[SIGNATURE_KEY] == signature()
    (entry,) = state[RANKS_KEY]
    assert entry[BATCHES_CONSUMED_KEY] == 4 and DATASET_KEY in entry[LOADER_STATE_KEY]
    resume = TrainResume()
    resume.accept(state, signature(), "stream")
    assert resume.pending is state and not resume.elastic
    loader = train_loader()
    assert resume.restore(loader, loader.dataset, rank=0) == 4
    assert resume.pending is None and resume.origin is None
    resumed = iter(loader)
    assert all(torch.equal(next(resumed)["input_ids"], batch) for batch in following)


def test_a_state_of_another_version_is_an_error_naming_both_versions_and_the_way_out():
    state, _ = saved_after(1)
    state[VERSION_KEY] = 1
    with pytest.raises(ValueError) as error:
        TrainResume().accept(state, signature(), "stream")
    assert str(error.value).startswith("The checkpoint's train data state has version 1, but this version of "
                                       f"lightning_tune_data reads version {STATE_VERSION}")
    assert str(error.value).endswith(RESUME_OPT_OUT)


@pytest.mark.parametrize(("change", "named"), [({"seed": 2}, "seed: checkpoint 1 -> now 2"),
                                               ({"packing": "greedy"}, "packing: checkpoint None -> now 'greedy'"),
                                               ({"sources": ["a"]}, "sources: checkpoint ['a', 'b'] -> now ['a']")])
def test_a_changed_setting_the_position_depends_on_cannot_be_resumed(change, named):
    state, _ = saved_after(1)
    with pytest.raises(ValueError, match="Cannot resume the train data: the data config changed") as error:
        TrainResume().accept(state, signature(**change), "stream")
    assert named in str(error.value) and RESUME_OPT_OUT in str(error.value)


def test_changed_weights_resume_each_source_where_it_was_with_a_warning():
    state, _ = saved_after(1)
    resume = TrainResume()
    with pytest.warns(UserWarning, match=r"Train source weights changed \(weights: .* -> .*\)"):
        resume.accept(state, signature(weights={"a": 0.5, "b": 0.5}), "stream")
    assert resume.pending is state and not resume.elastic


def test_another_layout_takes_the_elastic_path_for_streams_and_fails_for_map_style_data():
    state, _ = saved_after(2)
    with pytest.raises(ValueError, match=r"Cannot resume train_mode='map' data with another layout \(world_size"):
        TrainResume().accept(state, signature(world_size=2), "map")
    resume = TrainResume()
    with pytest.warns(UserWarning, match=r"Resuming the train data with a new layout \(world_size: 1 -> 2\)"):
        resume.accept(state, signature(world_size=2), "stream")
    assert resume.elastic

    class Recorder:
        def load_shard_states(self, states: list[dict[str, Any]]) -> None:
            self.states = states

    dataset = Recorder()
    assert resume.restore(train_loader(), dataset, rank=1) == 0  # nothing consumed in the new layout yet
    assert dataset.states == old_shard_states(state) and resume.origin is state


def test_a_stream_that_cannot_be_re_split_is_an_error_naming_the_way_out():
    state, _ = saved_after(2)
    resume = TrainResume()
    with pytest.warns(UserWarning):
        resume.accept(state, signature(num_workers=2), "stream")

    class Fixed:
        def load_shard_states(self, states: list[dict[str, Any]]) -> None:
            raise ElasticResumeUnsupported("its state cannot be split.")

    with pytest.raises(ValueError, match=r"^Cannot resume the train data with a new number of ranks or workers: its "
                                         r"state cannot be split\. To keep the model"):
        resume.restore(train_loader(), Fixed(), rank=0)


def test_old_shard_states_reads_every_workers_stream_state_out_of_the_loader_state():
    state, _ = saved_after(3, num_workers=2)
    loader_state = state[RANKS_KEY][0][LOADER_STATE_KEY]
    assert LOADER_KEY in loader_state and DATASET_KEY not in loader_state
    shards = old_shard_states(state)
    assert len(shards) == 2 and all(set(shard) == {"docs"} for shard in shards)
    in_process, _ = saved_after(3)
    assert old_shard_states(in_process) == [in_process[RANKS_KEY][0][LOADER_STATE_KEY][DATASET_KEY]]


def test_a_worker_without_a_stream_state_is_an_error_naming_worker_and_rank():
    state, _ = saved_after(3, num_workers=2)
    for snapshot in state[RANKS_KEY][0][LOADER_STATE_KEY][LOADER_KEY]["_snapshot"]["_worker_snapshots"].values():
        snapshot["dataset_state"] = None
    with pytest.raises(ValueError, match=r"^The checkpoint holds no train data state for worker 0 of rank 0"):
        old_shard_states(state)


def test_the_resume_warnings_say_that_the_train_data_starts_from_the_beginning():
    with pytest.warns(UserWarning, match=r"^resume_data_state=False: the checkpoint's train data position is ignored"):
        warn_data_state_ignored()
    with pytest.warns(UserWarning, match=r"^Resuming from last.ckpt, which holds no TextDataModule data state .*"
                                         r"starts from the beginning"):
        warn_no_data_state("TextDataModule", "last.ckpt")
