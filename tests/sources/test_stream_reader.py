"""StreamReader and row_document: one shard's rows of a datasets stream, its position, and rows as documents."""

from __future__ import annotations

import json
import logging
import pickle
from pathlib import Path

import datasets
import numpy as np
import pytest
from datasets.distributed import split_dataset_by_node

from lightning_tune_data.distributed import ShardInfo
from lightning_tune_data.sources.retries import RetryPolicy
from lightning_tune_data.sources.stream_reader import StreamReader, check_stream, row_document

datasets.disable_progress_bars()


def doubled(row: dict) -> dict:
    return {"input_ids": [row["i"]] * 2}


@pytest.fixture
def stream(tmp_path: Path) -> datasets.IterableDataset:
    """20 rows; row i's ``input_ids`` are ``[i, i]``."""
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(20)), encoding="utf-8")
    rows = datasets.load_dataset("json", data_files=str(path), split="train", streaming=True)
    return rows.map(doubled, remove_columns=["i"])


def reader(stream: datasets.IterableDataset) -> StreamReader:
    return StreamReader(stream, "web", RetryPolicy("web", 0, 0.0, 0.0), logging.getLogger(__name__))


def test_a_shard_gets_its_row_of_every_complete_group_and_the_position_counts_every_shards_rows(stream):
    shard = ShardInfo(rank=1, world_size=3)
    rows = reader(stream)
    seen = []
    for index, row in rows.rows(shard, epoch=0):
        seen.append((index, row["input_ids"][0][0], rows.position))
    assert seen == [(index, index, index + 2) for index in range(1, 18, 3)]  # 20 = 6 groups of 3 + 2 rows left
    assert rows.stream_done and rows.hf_state() is None


def test_a_restored_position_continues_with_the_next_rows_and_next_pass_starts_over(stream):
    first = reader(stream)
    rows = first.rows(ShardInfo(), epoch=0)
    [next(rows) for _ in range(7)]
    saved = (first.position, first.stream_done, first.hf_state())
    resumed = reader(stream)
    resumed.restore(*saved)
    assert [index for index, _ in resumed.rows(ShardInfo(), epoch=0)] == list(range(7, 20))
    resumed.next_pass()
    assert (resumed.position, resumed.stream_done, resumed.hf_state()) == (0, False, None)
    assert next(resumed.rows(ShardInfo(), epoch=1))[0] == 0


def test_a_pickled_reader_keeps_the_stream_state_of_its_position_and_not_the_live_copy(stream):
    rows = reader(stream)
    iterator = rows.rows(ShardInfo(), epoch=0)
    [next(iterator) for _ in range(5)]
    copy = pickle.loads(pickle.dumps(rows))
    assert copy._live is None and copy.hf_state() == rows.hf_state()
    assert [index for index, _ in copy.rows(ShardInfo(), epoch=0)] == list(range(5, 20))


def test_a_position_inside_a_group_is_a_state_of_another_sharding(stream):
    rows = reader(stream)
    rows.restore(3, False, None)
    with pytest.raises(ValueError, match="saved position 3 is not a multiple of the 2 shards"):
        next(rows.rows(ShardInfo(world_size=2), epoch=0))


def test_a_row_becomes_int64_ids_and_a_bool_mask():
    ids, mask = row_document({"input_ids": [[1, 2, 3]], "loss_mask": [[0, 1, 1]]})
    assert ids.dtype == np.int64 and ids.tolist() == [1, 2, 3]
    assert mask.dtype == np.bool_ and mask.tolist() == [False, True, True]
    assert row_document({"input_ids": [[4]], "loss_mask": [None]})[1] is None
    assert row_document({"input_ids": [[]]})[0].dtype == np.int64


@pytest.mark.parametrize(("row", "error", "message"), [
    ({"input_ids": [[1]], "_preprocess_error": ["boom"]}, ValueError, "preprocessing failed: boom"),
    ({"text": [["a"]]}, KeyError, "the row has no 'input_ids' column"),
    ({"input_ids": [[[1, 2], [3, 4]]]}, ValueError, "must be a flat list of token ids"),
    ({"input_ids": [[0.5]]}, ValueError, "must hold integer token ids"),
    ({"input_ids": [[1, 2]], "loss_mask": [[0.5, 1.0]]}, ValueError, "'loss_mask' must hold booleans"),
    ({"input_ids": [[1, 2]], "loss_mask": [[True]]}, ValueError, "'loss_mask' has shape"),
])
def test_a_row_that_is_not_a_document_raises_saying_why(row, error, message):
    with pytest.raises(error, match=message):
        row_document(row)


def test_only_an_unsplit_unshuffled_datasets_stream_is_accepted(stream):
    check_stream(stream, "web")
    with pytest.raises(TypeError, match="Source 'web': HFStreamingSource needs a datasets.IterableDataset"):
        check_stream(datasets.Dataset.from_dict({"input_ids": [[1]]}), "web")
    with pytest.raises(ValueError, match="split_dataset_by_node"):
        check_stream(split_dataset_by_node(stream, rank=0, world_size=2), "web")
    with pytest.raises(ValueError, match="Remove the .shuffle"):
        check_stream(stream.shuffle(seed=0, buffer_size=4), "web")
