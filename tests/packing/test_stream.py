"""PackStream: packs handed out one at a time or a batch's worth at once, and the round's start and end."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from lightning_tune_data.packing.packer import IterablePackedDataset
from lightning_tune_data.packing.pack import PackedSample
from lightning_tune_data.packing.stream import PackStream
from lightning_tune_data.sources.memory import InMemoryStream
from packing_helpers import (
    STRATEGIES,
    assert_same_packs,
    assert_taking_packs_equals_one_at_a_time,
    make_finite,
    make_interleaved,
)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("count", [1, 3, 8])
@pytest.mark.parametrize("source", ["interleaved", "finite"])
def test_taking_packs_in_batches_hands_out_the_packs_and_state_of_one_at_a_time(strategy, count, source):
    def make() -> IterablePackedDataset:
        child = make_interleaved() if source == "interleaved" else make_finite()
        return IterablePackedDataset(child, 48, strategy=strategy, buffer_size=8)

    if source == "interleaved":  # an endless child: compare a stretch of it
        one, many = make(), make()
        singles, batches = iter(one), iter(many)
        for _ in range(12):
            assert_same_packs([dict(p) for p in batches.take(count)],
                               [dict(p) for p in itertools.islice(singles, count)])
            assert many.state_dict() == one.state_dict()
        return
    assert_taking_packs_equals_one_at_a_time(make, count)


def test_a_finished_packer_starts_a_new_round_when_iterated_again():
    packer = IterablePackedDataset(make_finite(), 48, strategy="best_fit")
    first = list(packer)
    assert_same_packs(list(packer), first)




class _CountingStream(InMemoryStream):
    """A source that counts the iterators asked of it."""

    iterations = 0

    def __iter__(self):
        type(self).iterations += 1
        return super().__iter__()


def test_the_round_begins_at_the_first_pack_asked_for():
    _CountingStream.iterations = 0
    packer = IterablePackedDataset(_CountingStream([np.arange(1, 6)] * 4, "c", shuffle=False, num_passes=1), 8,
                                   strategy="greedy")
    stream = iter(packer)
    assert isinstance(stream, PackStream) and iter(stream) is stream
    assert _CountingStream.iterations == 0 and packer.counters["documents"] == 0  # nothing read yet
    first = next(stream)
    assert isinstance(first, PackedSample) and first["seq_lens"] == [5]
    assert _CountingStream.iterations == 1


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_taking_counts_the_packs_and_tokens_handed_out(strategy):
    packer = IterablePackedDataset(make_finite(), 48, strategy=strategy)
    stream = iter(packer)
    taken = stream.take(5) + [next(stream)] + stream.take(2)
    assert packer.counters["packs"] == len(taken) == 8
    assert packer.counters["tokens"] == sum(len(sample["input_ids"]) for sample in taken)


def test_after_the_round_is_over_the_stream_hands_out_nothing_more():
    packer = IterablePackedDataset(InMemoryStream([np.arange(1, 6)] * 3, "c", shuffle=False, num_passes=1), 8,
                                   strategy="greedy")
    stream = iter(packer)
    assert [p["seq_lens"] for p in stream.take(10)] == [[5], [5], [5]]
    assert stream.take(10) == [] and next(stream, None) is None
    assert packer.state_dict()["packed_c"]["finished"]
    assert [p["seq_lens"] for p in itertools.islice(packer, 10)] == [[5], [5], [5]]  # a new iter(): a new round
