"""Opening a committed local store: its shards in the commit's order, sizes checked, no bytes read;
a store of the earlier layout (one saved dataset) is still opened as it is."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pyarrow as pa

from lightning_tune_data.cache.marker import marker_content
from lightning_tune_data.cache.saved_dataset import save_dataset
from lightning_tune_data.cache.store_reader import open_store, store_shards
from lightning_tune_data.cache.tasks import files_section, store_section, write_task


def committed_store(folder: Path, parts: list[list[list[int]]]) -> dict:
    manifests = []
    for index, rows in enumerate(parts):
        table = pa.table({"input_ids": pa.array(rows, type=pa.list_(pa.int32()))})
        manifests.append(write_task(folder, table, "f" * 64, index, len(parts), {}, len(rows), 0, 1 << 20))
    content = marker_content({"fingerprint": "f" * 64}, {}, "source 'notes'", files_section(manifests),
                             store_section(manifests))
    (folder / "_COMPLETE.json").write_text(json.dumps(content))
    return content


def test_the_shards_of_every_task_open_as_one_dataset_in_task_order(tmp_path: Path) -> None:
    content = committed_store(tmp_path, [[[1, 2], [3]], [], [[4], [5, 6, 7]]])
    assert store_shards(content) == [f"shards/task-{i:05d}-of-00003/00000.arrow" for i in range(3)]
    dataset, problem = open_store(tmp_path)
    assert problem is None and dataset["input_ids"] == [[1, 2], [3], [4], [5, 6, 7]]
    assert content["store"]["rows"] == 4 and content["store"]["tokens"] == 7


def test_a_missing_or_truncated_shard_is_named(tmp_path: Path) -> None:
    committed_store(tmp_path, [[[1, 2]], [[3]]])
    shard = tmp_path / "shards" / "task-00001-of-00002" / "00000.arrow"
    shard.write_bytes(shard.read_bytes()[:20])
    assert open_store(tmp_path)[1].startswith("shard shards/task-00001-of-00002/00000.arrow has 20 bytes")
    shard.unlink()
    assert open_store(tmp_path) == (None, "shard shards/task-00001-of-00002/00000.arrow is missing")


def test_a_cache_of_the_earlier_layout_opens_as_it_is(tmp_path: Path) -> None:
    save_dataset(tmp_path, datasets.Dataset.from_dict({"input_ids": [[1, 2], [3]]}), skipped_rows=0)
    (tmp_path / "_COMPLETE.json").write_text(json.dumps({"cache_format": 2, "files": {}}))
    dataset, problem = open_store(tmp_path)
    assert problem is None and dataset["input_ids"] == [[1, 2], [3]]
