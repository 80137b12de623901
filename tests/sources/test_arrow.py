"""ArrowSource: infinite passes, per-pass permutations, rank x worker sharding, exact resume, settings."""

from __future__ import annotations

import pickle
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_tune_data.collate import PackedCollator
from lightning_tune_data.packing.packer import IterablePackedDataset
from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.arrow import ArrowSource

from source_tables import described, gappy_table, rows_of, table, take


def test_each_pass_visits_every_row_once_in_a_new_order():
    stream = ArrowSource(table(20), "src", seed=3)
    samples = take(stream, 60)
    passes = [rows_of(samples[i : i + 20]) for i in (0, 20, 40)]
    for number, rows in enumerate(passes):
        assert sorted(rows) == list(range(20))
        assert {s["epoch"] for s in samples[number * 20 : (number + 1) * 20]} == {number}
    assert passes[0] != passes[1] != passes[2]


def test_order_of_a_pass_is_a_pure_function_of_seed_and_pass():
    first = rows_of(take(ArrowSource(table(30), "src", seed=11), 90))
    second = rows_of(take(ArrowSource(table(30), "src", seed=11), 90))
    other = rows_of(take(ArrowSource(table(30), "src", seed=12), 90))
    assert first == second
    assert first != other


def test_shuffle_false_keeps_file_order():
    assert rows_of(take(ArrowSource(table(5), "src", shuffle=False), 10)) == [0, 1, 2, 3, 4] * 2


def test_samples_are_zero_copy_views_with_source_and_loss_mask():
    sample = take(ArrowSource(table(8, with_mask=True), "docs", shuffle=False), 4)[3]
    assert sample["source"] == "docs" and sample["epoch"] == 0
    assert sample["input_ids"].tolist() == [3, 3, 3, 3]
    assert sample["loss_mask"].dtype == np.bool_ and sample["loss_mask"].tolist() == [True, False, True, False]


@pytest.mark.parametrize("stop_at", [0, 1, 7, 19, 20, 21, 45])
def test_state_after_k_samples_resumes_bitwise_including_across_pass_boundaries(stop_at: int):
    reference = ArrowSource(table(20), "src", seed=5)
    iterator = iter(reference)
    for _ in range(stop_at):
        next(iterator)
    state = pickle.loads(pickle.dumps(reference.state_dict()))
    expected = [next(iterator) for _ in range(30)]

    resumed = ArrowSource(table(20), "src", seed=5)
    resumed.load_state_dict(state)
    got = take(resumed, 30)
    assert rows_of(got) == rows_of(expected)
    assert [s["epoch"] for s in got] == [s["epoch"] for s in expected]


def test_empty_documents_are_skipped_and_counted_and_an_all_empty_source_is_an_error_not_a_hang():
    mixed = pa.table({"input_ids": pa.array([[1], [], [2, 2], []], type=pa.list_(pa.int32()))})
    stream = ArrowSource(mixed, "gaps", shuffle=False)
    assert rows_of(take(stream, 4)) == [1, 2, 1, 2]
    assert stream.counters["empty_skipped"] == 3  # the last empty row of pass 1 is not reached yet
    empty = pa.table({"input_ids": pa.array([[]] * 6, type=pa.list_(pa.int32()))})
    with pytest.raises(RuntimeError, match=r"Source 'blank'.*shard 0 of 1.*empty: 6"):
        next(iter(ArrowSource(empty, "blank")))


def test_one_worker_shard_with_only_empty_documents_fails_naming_the_shard():
    rows = [[], [7], [], [8], [], [9], [], [6]]  # shard 0 of 2 (no shuffle) gets only the empty rows
    data = pa.table({"input_ids": pa.array(rows, type=pa.list_(pa.int32()))})
    loader = StatefulDataLoader(ArrowSource(data, "half", shuffle=False), batch_size=1, num_workers=2,
                                collate_fn=lambda b: b)
    with pytest.raises(RuntimeError, match="shard 0 of 2"):
        list(zip(range(10), loader))


def test_resume_with_another_worker_count_reads_every_row_of_the_pass_exactly_once():
    def loader(num_workers):
        return StatefulDataLoader(ArrowSource(table(60), "src", seed=4), batch_size=2, num_workers=num_workers,
                                  collate_fn=lambda b: [int(s["input_ids"][0]) for s in b])

    old = loader(2)
    iterator = iter(old)
    seen = [row for _ in range(7) for row in next(iterator)]
    state = old.state_dict()
    shard_states = [snapshot["dataset_state"] for snapshot in state["_snapshot"]["_worker_snapshots"].values()]
    del iterator, old

    stream = ArrowSource(table(60), "src", seed=4)
    stream.load_shard_states(shard_states)
    resumed = StatefulDataLoader(stream, batch_size=2, num_workers=3, collate_fn=lambda b: [int(s["input_ids"][0]) for s in b])
    iterator = iter(resumed)
    while len(seen) < 60:
        seen += next(iterator)
    assert sorted(seen) == list(range(60))


def test_two_ranks_with_two_workers_partition_each_pass_with_equal_counts():
    num_rows = 103  # 103 = 4 * 25 + 3: three rows are the documented per-pass remainder
    seen: Counter = Counter()
    per_rank = []
    for rank in (0, 1):
        stream = ArrowSource(table(num_rows), "src", seed=1, rank=rank, world_size=2, num_passes=1)
        loader = StatefulDataLoader(stream, batch_size=5, num_workers=2, collate_fn=lambda batch: batch)
        rows = [int(s["input_ids"][0]) for batch in loader for s in batch]
        per_rank.append(len(rows))
        seen.update(rows)
    assert per_rank == [50, 50]
    assert set(seen.values()) == {1}, "no row may be read twice in one pass"
    assert len(seen) == num_rows - 3


def test_worker_states_resume_exactly_through_stateful_dataloader():
    def loader():
        stream = ArrowSource(table(40), "src", seed=2)
        return StatefulDataLoader(stream, batch_size=3, num_workers=2, collate_fn=lambda b: [int(s["input_ids"][0]) for s in b])

    reference = loader()
    iterator = iter(reference)
    for _ in range(9):
        next(iterator)
    state = reference.state_dict()
    expected = [next(iterator) for _ in range(20)]

    resumed = loader()
    resumed.load_state_dict(state)
    iterator = iter(resumed)
    assert [next(iterator) for _ in range(20)] == expected


def test_more_shards_than_rows_is_a_clear_error():
    stream = ArrowSource(table(3), "tiny", rank=0, world_size=4)
    with pytest.raises(ValueError, match="fewer than its 4 shards"):
        next(iter(stream))


def test_filter_that_drops_everything_is_an_error_not_a_hang():
    stream = ArrowSource(table(10), "src", filter_fn=lambda sample: False)
    with pytest.raises(RuntimeError, match="produced no usable document"):
        next(iter(stream))


def test_rows_are_read_right_across_many_chunks():
    chunked = pa.concat_tables([table(5).slice(0, 5), table(12).slice(5, 7), table(20).slice(12, 8)])
    assert chunked.column("input_ids").num_chunks == 3
    stream = ArrowSource(chunked, "src", shuffle=False)
    assert rows_of(take(stream, 20)) == list(range(20))
    assert [len(s["input_ids"]) for s in take(ArrowSource(chunked, "src", shuffle=False), 20)] == [1 + i % 7 for i in range(20)]


def packed_batches(source: ArrowSource, count: int) -> list[dict]:
    """``count`` collated batches of 4 packs of 16 tokens read from ``source``."""
    collate, packs = PackedCollator(pad_id=0, max_seq_len=16), iter(IterablePackedDataset(source, 16, buffer_size=4))
    return [collate([next(packs) for _ in range(4)]) for _ in range(count)]


@pytest.mark.parametrize("overlong", ["truncate", "drop"])
def test_settings_give_bitwise_the_same_documents_and_batches_as_the_keywords(overlong: str):
    options = dict(seed=7, rank=1, world_size=2, num_passes=3, max_seq_len=5, overlong=overlong)
    by_keywords = ArrowSource(gappy_table(300), "src", **options)
    by_settings = ArrowSource(gappy_table(300), "src", settings=StreamSettings(**options))
    assert by_settings.settings == by_keywords.settings == StreamSettings(**options)
    assert described(list(by_settings)) == described(list(by_keywords))
    assert by_settings.counters == by_keywords.counters

    options.update(num_passes=None, rank=0, world_size=1)
    keyword_batches = packed_batches(ArrowSource(gappy_table(300), "src", **options), 30)
    settings_batches = packed_batches(ArrowSource(gappy_table(300), "src", settings=StreamSettings(**options)), 30)
    for got, want in zip(settings_batches, keyword_batches, strict=True):
        assert got.keys() == want.keys()
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
            else:
                assert got[key] == value, key


def test_a_value_given_both_as_keyword_and_in_settings_is_refused():
    with pytest.raises(ValueError, match="Source 'src': seed, max_seq_len given both"):
        ArrowSource(table(5), "src", seed=3, max_seq_len=4, settings=StreamSettings(seed=3))


def test_the_run_wide_attributes_read_the_settings_and_are_read_only():
    settings = StreamSettings(seed=9, rank=1, world_size=3, num_passes=2, max_seq_len=8, overlong="drop")
    source = ArrowSource(table(12), "src", shuffle=False, max_error_count=2, settings=settings)
    assert (source.seed, source.rank, source.world_size, source.num_passes, source.max_seq_len, source.overlong) == (
        9, 1, 3, 2, 8, "drop")
    assert (source.shuffle, source.max_error_count) == (False, 2)
    with pytest.raises(AttributeError):
        source.seed = 1


def test_a_pickled_source_keeps_its_settings_and_position():
    source = ArrowSource(table(30), "src", settings=StreamSettings(seed=4, max_seq_len=3))
    iterator = iter(source)
    for _ in range(11):
        next(iterator)
    copy = pickle.loads(pickle.dumps(source))
    assert copy.settings == source.settings
    assert copy.state_dict() == source.state_dict()
    assert [s["input_ids"].tolist() for s in take(copy, 25)] == [next(iterator)["input_ids"].tolist() for _ in range(25)]


@pytest.mark.parametrize(("options", "message"), [
    (dict(overlong="cut"), "overlong='cut'; use one of"),
    (dict(num_passes=0), "num_passes must be >= 1"),
])
def test_bad_options_are_refused_naming_the_source(options, message):
    with pytest.raises(ValueError, match=f"Source 'src': {message}"):
        ArrowSource(table(5), "src", **options)
    with pytest.raises(ValueError, match="Source 'void' has no rows"):
        ArrowSource(table(0), "void")
