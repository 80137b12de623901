"""Tasks and commits: a task counts as finished only with a done-marker matching its manifest and
its shards in place; the commit merges every task, is written last, and its bytes depend only on
the tasks' content."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from lightning_tune_data.cache.marker import COMPLETE_MARKER
from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.cache.store_files import StoreFiles
from lightning_tune_data.cache.tasks import (
    StoreNotCommittedError,
    TaskManifest,
    commit_store,
    describe_tasks,
    done_marker_path,
    finished_task,
    task_manifest_path,
    task_progress,
    write_task,
)

FINGERPRINT = "e" * 64
METADATA = {"fingerprint": FINGERPRINT, "manager": "LocalDatasetManager"}


def task(files: StoreFiles, index: int, count: int, rows: list[list[int]], columns: tuple = ("input_ids",),
         marker: bool = True, part: dict | None = None) -> TaskManifest:
    """Write task ``index`` of ``count`` into the store; ``marker=False``: as if killed before its done-marker;
    ``part``: what the task read (default: row ``index`` of ``count`` rows)."""
    table = pa.table({"input_ids": pa.array(rows, type=pa.list_(pa.int32()))})
    if "loss_mask" in columns:
        table = table.append_column("loss_mask", pa.array([[True] * len(r) for r in rows], pa.list_(pa.bool_())))
    manifest = write_task(Path(files.path()), table, FINGERPRINT, index, count, part or {"rows": [index, index + 1], "of_rows": count},
                          len(rows), 0, 1 << 20)
    if not marker:
        (Path(files.path()) / done_marker_path(index, count)).unlink()
    return manifest


@pytest.fixture
def files(tmp_path: Path) -> StoreFiles:
    return StoreFiles(StoreRoot(str(tmp_path)), "notes-eeee")


def test_a_task_is_finished_only_with_a_matching_done_marker_and_its_shards(files: StoreFiles) -> None:
    written = task(files, 0, 2, [[1, 2]], marker=False)
    assert finished_task(files, 0, 2, FINGERPRINT) is None  # killed before its done-marker
    files.write_bytes(done_marker_path(0, 2), written.done_marker())
    assert finished_task(files, 0, 2, FINGERPRINT) == written
    assert finished_task(files, 0, 2, "other" * 8) is None  # another configuration's task
    files.write_bytes(task_manifest_path(0, 2), written.encoded().replace(b'"rows_read": 1', b'"rows_read": 9'))
    assert finished_task(files, 0, 2, FINGERPRINT) is None  # manifest changed after its marker
    files.write_bytes(task_manifest_path(0, 2), written.encoded())
    (Path(files.path()) / written.shards[0].path).write_bytes(b"short")
    assert finished_task(files, 0, 2, FINGERPRINT) is None  # a shard lost or cut
    assert finished_task(files, 0, 2, FINGERPRINT, check_shards=False) == written


def test_progress_lists_done_tasks_per_task_count(files: StoreFiles) -> None:
    task(files, 0, 3, [[1]])
    task(files, 2, 3, [[2]])
    task(files, 1, 3, [[3]], marker=False)
    assert task_progress(files) == {3: {0, 2}}


def test_the_commit_lists_every_shard_in_task_order_and_is_written_last(files: StoreFiles) -> None:
    task(files, 1, 2, [[3], [4, 5]])
    with pytest.raises(StoreNotCommittedError, match=r"source 'notes': cannot commit the store at .*notes-eeee: "
                                                     r"task 0 of 2 has not finished"):
        commit_store(files, 2, FINGERPRINT, METADATA, {}, "source 'notes'")
    assert not files.exists(COMPLETE_MARKER)
    task(files, 0, 2, [[1, 2]])
    content = commit_store(files, 2, FINGERPRINT, METADATA, {"source_key": "notes"}, "source 'notes'")
    first_bytes = files.read_bytes(COMPLETE_MARKER)
    store = content["store"]
    assert (store["rows"], store["tokens"], store["num_tasks"], store["columns"]) == (3, 5, 2, ["input_ids"])
    assert [s["path"] for s in store["shards"]] == ["shards/task-00000-of-00002/00000.arrow",
                                                    "shards/task-00001-of-00002/00000.arrow"]
    assert set(content["files"]) >= {task_manifest_path(0, 2), done_marker_path(1, 2)}
    commit_store(files, 2, FINGERPRINT, METADATA, {"source_key": "notes"}, "source 'notes'")
    assert files.read_bytes(COMPLETE_MARKER) == first_bytes  # a second finalizer writes the same bytes


def test_tasks_that_disagree_on_columns_or_hold_no_rows_are_not_committed(files: StoreFiles) -> None:
    task(files, 0, 2, [[1]])
    task(files, 1, 2, [[2]], columns=("input_ids", "loss_mask"))
    with pytest.raises(StoreNotCommittedError, match=r"the tasks wrote different columns"):
        commit_store(files, 2, FINGERPRINT, METADATA, {}, "source 'notes'")
    empty = StoreFiles(files.root, "empty")
    task(empty, 0, 1, [])
    with pytest.raises(StoreNotCommittedError, match=r"no rows left after preprocessing \(0 rows read"):
        commit_store(empty, 1, FINGERPRINT, METADATA, {}, "source 'notes'")


@pytest.mark.parametrize(("parts", "problem"), [
    ([{"rows": [0, 5], "of_rows": 10}, {"rows": [5, 11], "of_rows": 11}], r"different row counts of the source \(10, 11\)"),
    ([{"rows": [0, 5], "of_rows": 10}, {"rows": [4, 10], "of_rows": 10}], r"task 1 read rows \[4, 10\), which overlaps"),
    ([{"rows": [0, 4], "of_rows": 10}, {"rows": [5, 10], "of_rows": 10}], r"task 1 read rows \[5, 10\), which leaves a gap"),
    ([{"file_range": [0, 2], "of_files": 4}, {"file_range": [2, 3], "of_files": 4}], r"the tasks read files \[0, 3\) of 4"),
    ([{"file_range": [0, 2], "of_files": 4}, {"rows": [5, 10], "of_rows": 10}], r"others by rows"),
    ([{"rows": [0, 5], "of_rows": 10, "revision": "aaa"}, {"rows": [5, 10], "of_rows": 10, "revision": "bbb"}],
     r"different revisions of the source \(task 0: aaa; task 1: bbb\)"),
])
def test_tasks_that_saw_another_source_or_miss_or_repeat_rows_are_not_committed(
        files: StoreFiles, parts: list[dict], problem: str) -> None:
    for index, part in enumerate(parts):
        task(files, index, 2, [[index + 1]], part=part)
    with pytest.raises(StoreNotCommittedError, match=problem + r".*remove the store at .*notes-eeee and prepare it again"):
        commit_store(files, 2, FINGERPRINT, METADATA, {}, "source 'notes'")
    assert not files.exists(COMPLETE_MARKER)


def test_tasks_that_cover_every_row_once_from_one_revision_are_committed(files: StoreFiles) -> None:
    task(files, 0, 2, [[1]], part={"rows": [0, 5], "of_rows": 10, "revision": "aaa"})
    task(files, 1, 2, [[2]], part={"rows": [5, 10], "of_rows": 10, "revision": "aaa"})
    assert commit_store(files, 2, FINGERPRINT, METADATA, {}, "source 'notes'")["store"]["rows"] == 2


def test_task_lists_are_shortened_in_messages() -> None:
    assert describe_tasks([2], 4) == "task 2"
    assert describe_tasks(list(range(20)), 64).endswith(", 11, ... (20 in all)")
