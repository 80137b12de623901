"""SourceCounters and the shard-mismatch error shared by the indexed sources."""

from __future__ import annotations

import json

from lightning_tune_data.distributed import ShardInfo
from lightning_tune_data.sources.source_state import SourceCounters, shard_mismatch_error


def test_counters_are_saved_as_plain_ints_and_loaded_in_place():
    counters = SourceCounters(errors=1, filtered=2, overlong_truncated=3, overlong_dropped=4, empty_skipped=5)
    state = json.loads(json.dumps(counters.state_dict()))
    assert state == {"errors": 1, "filtered": 2, "overlong_truncated": 3, "overlong_dropped": 4, "empty_skipped": 5}
    shared = SourceCounters()
    before = shared
    shared.load_state_dict(state)
    assert shared is before and shared == counters
    shared.load_state_dict({"errors": 7})  # a missing count is 0
    assert shared.state_dict() == {**SourceCounters().state_dict(), "errors": 7}


def test_the_total_of_several_shards_sums_every_count():
    total = SourceCounters.total([{"errors": 1, "empty_skipped": 2}, {"errors": 3, "filtered": 4}, {}])
    assert total == SourceCounters(errors=4, filtered=4, empty_skipped=2)


def test_what_was_skipped_since_a_snapshot_is_summarised_by_reason():
    counters = SourceCounters(filtered=1)
    before = counters.snapshot()
    counters.filtered += 2
    counters.empty_skipped += 5
    counters.overlong_truncated += 9  # cut, not skipped: not in the summary
    assert counters.since(before) == "filtered: 2, failed: 0, overlong dropped: 0, empty: 5"
    assert before == {**SourceCounters().state_dict(), "filtered": 1}  # the snapshot did not move


def test_the_shard_mismatch_error_names_both_shards_and_the_way_to_change_layouts():
    error = shard_mismatch_error("web", 1, 4, ShardInfo(rank=0, world_size=2))
    assert isinstance(error, ValueError)
    assert str(error).startswith("Source 'web': the state was written by shard 1 of 4 (world_size x num_workers) "
                                 "but this is shard 0 of 2.")
    assert "load_shard_states()" in str(error)
