"""Task leases: a running task renews its lease, so a store being written is never stale; a store
that is not committed is stale only after its tasks showed no sign of life for the stated time."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa

from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.cache.store_files import StoreFiles
from lightning_tune_data.cache.task_lease import STALE_AFTER_S, TaskLease, live_tasks, uncommitted_status
from lightning_tune_data.cache.tasks import write_task


def test_a_held_lease_is_renewed_and_removed_when_the_task_ends(tmp_path: Path) -> None:
    files = StoreFiles(StoreRoot(str(tmp_path)), "notes-0123")
    with TaskLease(files, 2, 4, heartbeat_s=0.05):
        assert live_tasks(files) == [2]
        first = files.read_json("tasks/task-00002-of-00004.lease")["time"]
        deadline = time.time() + 10
        while files.read_json("tasks/task-00002-of-00004.lease")["time"] == first and time.time() < deadline:
            time.sleep(0.02)
        assert files.read_json("tasks/task-00002-of-00004.lease")["time"] > first  # the heartbeat renews it
    assert live_tasks(files) == [] and not files.exists("tasks/task-00002-of-00004.lease")


def test_a_store_being_written_or_recently_active_is_not_stale_a_dead_one_is(tmp_path: Path) -> None:
    files = StoreFiles(StoreRoot(str(tmp_path)), "notes-0123")
    table = pa.table({"input_ids": pa.array([[1, 2]], type=pa.list_(pa.int32()))})
    write_task(Path(files.path()), table, "f" * 64, 0, 4, {"rows": [0, 1], "of_rows": 4}, 1, 0, 1 << 20)
    with TaskLease(files, 1, 4):
        status, stale = uncommitted_status(files)
        assert (status, stale) == ("being written: task 1 running; tasks 1, 2, 3 of 4 unfinished", False)
    status, stale = uncommitted_status(files)  # task 0 finished a moment ago; 1-3 queued in a job array
    assert not stale and status.startswith("not committed: tasks 1, 2, 3 of 4 unfinished, last task activity")
    status, stale = uncommitted_status(files, now=time.time() + STALE_AFTER_S + 60)
    assert stale and status == "not committed: tasks 1, 2, 3 of 4 unfinished, no sign of life for 1d"
