"""TuneIterableDataset: what every stream gets by default (snapshots, refusals of layout changes, state lookup)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from lightning_tune_data.sources.base import ElasticResumeUnsupported, TuneIterableDataset


class Counting(TuneIterableDataset):
    """Yields 0, 1, 2, ...; its state is the next number."""

    def __init__(self) -> None:
        self.next = 0

    @property
    def dataset_name(self) -> str:
        return "count"

    def __iter__(self) -> Iterator[dict[str, Any]]:
        while True:
            self.next += 1
            yield {"value": self.next - 1}

    def state_dict(self) -> dict[str, Any]:
        return {"count": {"next": self.next}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.next = self._own_state(state_dict)["next"]


def test_the_default_snapshot_records_the_state_when_it_is_taken():
    stream = Counting()
    iterator = iter(stream)
    next(iterator)
    snapshot = stream.snapshot()
    next(iterator)
    assert snapshot() == {"count": {"next": 1}} and stream.state_dict() == {"count": {"next": 2}}


def test_a_stream_that_cannot_split_its_state_refuses_another_layout_naming_the_way_out():
    stream = Counting()
    with pytest.raises(ElasticResumeUnsupported, match=r"Stream 'count' \(Counting\).*resume_data_state: false"):
        stream.merge_shard_states([stream.state_dict()])
    with pytest.raises(ElasticResumeUnsupported, match="Stream 'count'"):
        stream.load_global_state({"count": {}})
    with pytest.raises(ElasticResumeUnsupported):
        stream.load_shard_states([stream.state_dict(), stream.state_dict()])
    assert issubclass(ElasticResumeUnsupported, ValueError)


def test_a_stream_by_default_cannot_read_a_document_again():
    assert Counting().read_document("count", 3, 0) is None


def test_a_state_without_this_streams_entry_is_refused_listing_what_it_holds():
    with pytest.raises(KeyError, match=r"State for stream 'count' not found; the state holds \['a', 'b'\]"):
        Counting().load_state_dict({"b": {}, "a": {}})
