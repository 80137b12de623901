"""Reading an ArrowSource shard one document at a time: lazy position, resume mid-block, pickling."""

from __future__ import annotations

import pickle

import pytest

import lightning_tune_data.sources.arrow_iteration as arrow_iteration
from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.arrow import ArrowSource
from lightning_tune_data.sources.arrow_columns import ListColumn
from lightning_tune_data.sources.arrow_iteration import shard_documents
from lightning_tune_data.sources.arrow_rows import ArrowRows
from lightning_tune_data.sources.arrow_state import ArrowSourceState
from lightning_tune_data.sources.length_policy import LengthPolicy
from lightning_tune_data.sources.sample_transforms import SampleTransforms
from lightning_tune_data.sources.source_state import SourceCounters

from source_tables import described, gappy_table, table, take


def parts(data, settings: StreamSettings, shuffle: bool = False):
    """The parts an ArrowSource is made of, built by hand over ``data``."""
    counters = SourceCounters()
    rows = ArrowRows(data, "src", settings, shuffle)
    state = ArrowSourceState("src", rows.num_rows, settings, counters)
    return state, rows, SampleTransforms("src", [], None, None, 0, counters), LengthPolicy(settings, counters)


def test_shard_documents_yields_the_documents_within_the_policy_in_pass_order_and_counts_the_rest():
    data = gappy_table(40)
    lengths = [len(row) for row in data.column("input_ids").to_pylist()]
    settings = StreamSettings(num_passes=1, max_seq_len=3, overlong="drop")
    state, rows, transforms, policy = parts(data, settings)
    documents = list(shard_documents("src", settings, state, rows, transforms, policy))
    assert [d["source_row"] for d in documents] == [i for i, n in enumerate(lengths) if 0 < n <= 3]
    assert sum(d.get("dropped_before", 0) for d in documents) + policy.dropped_since_yield == sum(n > 3 for n in lengths)
    assert state.counters.state_dict() == {"errors": 0, "filtered": 0, "overlong_truncated": 0,
                                           "overlong_dropped": sum(n > 3 for n in lengths),
                                           "empty_skipped": lengths.count(0)}
    assert state.walk().epoch == 1  # the one pass is over


def test_the_plan_advances_lazily_and_the_state_always_describes_the_documents_read():
    settings = StreamSettings()
    state, rows, transforms, policy = parts(table(50), settings)
    iterator = shard_documents("src", settings, state, rows, transforms, policy)
    looked = 0
    for read in range(1, 20):
        next(iterator)
        plan = state.cursor[0]
        assert state.cursor[1] == read and plan.taken == looked  # nothing applied while the block is read ...
        if read % 3 == 0:
            assert state.state_dict()["src"]["walk"]["plan"]["tail_taken"] == read  # ... until someone looks
            assert plan.taken == read
            looked = read


def test_rows_are_read_rows_per_step_at_a_time_and_the_step_changes_nothing_else(monkeypatch):
    reference = described(take(ArrowSource(gappy_table(100), "src", seed=3, max_seq_len=5), 250))
    sizes = []
    read_rows = ListColumn.rows

    def recording(self, indices):
        sizes.append(len(indices))
        return read_rows(self, indices)

    monkeypatch.setattr(arrow_iteration, "ROWS_PER_STEP", 7)
    monkeypatch.setattr(ListColumn, "rows", recording)
    assert described(take(ArrowSource(gappy_table(100), "src", seed=3, max_seq_len=5), 250)) == reference
    assert max(sizes) == 7 and len(sizes) > 250 // 7


def test_a_shard_without_rows_and_a_pass_without_documents_are_errors_not_hangs():
    settings = StreamSettings(rank=0, world_size=4)
    with pytest.raises(ValueError, match="'src' has 3 rows, fewer than its 4 shards"):
        next(shard_documents("src", settings, *parts(table(3), settings)))
    empty = gappy_table(4).slice(3, 1)  # row 3 is empty
    with pytest.raises(RuntimeError, match=r"shard 0 of 1 \(1 rows\) produced no usable document \(.*empty: 1"):
        next(shard_documents("src", StreamSettings(), *parts(empty, StreamSettings())))


@pytest.mark.parametrize("stop_at", [0, 1, 2, 300, 450, 451, 452, 903, 1150, 1400])
def test_resume_from_a_state_taken_mid_block_continues_identically(stop_at: int):
    reference = ArrowSource(gappy_table(1100), "src", seed=9, max_seq_len=5)
    iterator = iter(reference)
    for _ in range(stop_at):
        next(iterator)
    state = pickle.loads(pickle.dumps(reference.state_dict()))
    expected = [next(iterator) for _ in range(600)]  # crosses block and pass boundaries

    resumed = ArrowSource(gappy_table(1100), "src", seed=9, max_seq_len=5)
    resumed.load_state_dict(state)
    assert described(take(resumed, 600)) == described(expected)
    assert resumed.counters == reference.counters


def test_taking_the_state_mid_block_does_not_change_what_the_stream_yields():
    untouched = take(ArrowSource(gappy_table(700), "src", seed=4, max_seq_len=5, overlong="drop"), 1500)
    observed = ArrowSource(gappy_table(700), "src", seed=4, max_seq_len=5, overlong="drop")
    iterator, samples = iter(observed), []
    for _ in range(1500):
        samples.append(next(iterator))
        observed.state_dict()
    assert described(samples) == described(untouched)


def test_a_source_pickled_mid_iteration_continues_after_the_documents_read():
    stream = ArrowSource(gappy_table(900), "src", seed=2, max_seq_len=5)
    iterator = iter(stream)
    for _ in range(333):
        next(iterator)
    copy = pickle.loads(pickle.dumps(stream))
    assert described(take(copy, 500)) == described([next(iterator) for _ in range(500)])


def test_resume_mid_block_with_a_loss_mask_and_a_transform_continues_identically():
    def tag(sample):
        return dict(sample, tagged=True)

    def source():
        return ArrowSource(table(1200, with_mask=True), "src", seed=1, model_transform=tag, max_seq_len=4)

    reference = source()
    iterator = iter(reference)
    for _ in range(700):
        next(iterator)
    state = reference.state_dict()
    expected = [next(iterator) for _ in range(300)]
    resumed = source()
    resumed.load_state_dict(state)
    got = take(resumed, 300)
    assert described(got) == described(expected)
    assert [s["loss_mask"].tolist() for s in got] == [s["loss_mask"].tolist() for s in expected]
