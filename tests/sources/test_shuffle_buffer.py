"""ShuffleBuffer: seeded counter-based draws, and the held documents saved and restored exactly."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from lightning_tune_data.distributed import ShardInfo
from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.shuffle_buffer import ShuffleBuffer


def buffer_with(documents: list, seed: int = 0, source: str = "web", size: int = 8) -> ShuffleBuffer:
    buffer = ShuffleBuffer(source, size, StreamSettings(seed=seed))
    buffer.documents.extend(documents)
    return buffer


def documents(count: int) -> list:
    return [(np.arange(i + 1, dtype=np.int64), None if i % 2 else np.arange(i + 1) % 2 == 0) for i in range(count)]


def draws(buffer: ShuffleBuffer, count: int, epoch: int = 0, shard: ShardInfo = ShardInfo()) -> list[int]:
    return [buffer.draw_index(epoch, shard) for _ in range(count)]


def test_draws_are_uniform_indices_that_depend_on_seed_source_pass_and_shard():
    first = draws(buffer_with(documents(8)), 3000)
    assert set(first) == set(range(8)) and first == draws(buffer_with(documents(8)), 3000)
    assert first != draws(buffer_with(documents(8), seed=1), 3000)
    assert first != draws(buffer_with(documents(8), source="code"), 3000)
    assert first != draws(buffer_with(documents(8)), 3000, epoch=1)
    assert first != draws(buffer_with(documents(8)), 3000, shard=ShardInfo(rank=1, world_size=2))


def test_the_draw_count_is_the_whole_generator_state():
    buffer = buffer_with(documents(8))
    draws(buffer, 1500)
    assert buffer.draws == 1500
    resumed = buffer_with(documents(8))
    resumed.draws = 1500
    assert draws(resumed, 700) == draws(buffer, 700)


def test_the_state_holds_the_documents_as_plain_lists_and_restores_them_exactly():
    buffer = buffer_with(documents(5))
    draws(buffer, 3)
    state = json.loads(json.dumps(buffer.state_dict()))
    assert state["shuffle_buffer_size"] == 8 and state["draws"] == 3
    assert state["buffer_lengths"] == [1, 2, 3, 4, 5] and state["buffer_has_loss_mask"] == [True, False, True, False, True]
    assert len(state["buffer_input_ids"]) == 15 and len(state["buffer_loss_mask"]) == 1 + 3 + 5
    restored = ShuffleBuffer("web", 8, StreamSettings())
    restored.load_state_dict(state)
    assert restored.draws == 3
    for (ids, mask), (want_ids, want_mask) in zip(restored.documents, buffer.documents, strict=True):
        assert ids.dtype == np.int64 and ids.tolist() == want_ids.tolist()
        assert (mask is None) == (want_mask is None) and (mask is None or mask.tolist() == want_mask.tolist())


def test_a_state_of_another_buffer_size_or_an_inconsistent_one_is_refused():
    state = buffer_with(documents(3)).state_dict()
    with pytest.raises(ValueError, match="Source 'web': the checkpoint was written with a shuffle buffer of 8 documents"):
        ShuffleBuffer("web", 4, StreamSettings()).load_state_dict(state)
    state["buffer_lengths"][0] += 1
    with pytest.raises(ValueError, match="the saved shuffle buffer is inconsistent"):
        ShuffleBuffer("web", 8, StreamSettings()).load_state_dict(state)


def test_a_pickled_buffer_keeps_its_documents_and_draws_but_not_its_generated_block():
    buffer = buffer_with(documents(4))
    draws(buffer, 10)
    copy = pickle.loads(pickle.dumps(buffer))
    assert copy._block is None and copy.draws == 10 and len(copy.documents) == 4
    assert draws(copy, 50) == draws(buffer, 50)
