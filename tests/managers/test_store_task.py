"""One task of a source's store: written once (a rerun skips it), published, and the store
committed by whichever task finishes last, with the same rows whatever the number of tasks."""

from __future__ import annotations

import os
from pathlib import Path

import datasets
import pytest
from conftest import make_texts, write_jsonl

from lightning_tune_data.cache.marker import COMPLETE_MARKER
from lightning_tune_data.cache.tasks import StoreNotCommittedError
from lightning_tune_data.managers import CacheMissingError, LocalDatasetManager
from lightning_tune_data.managers.store_task import finalize_source_store, run_store_task
from lightning_tune_data.tokenizers import ByteTokenizer

TOK = ByteTokenizer()


def manager(tmp_path: Path, files: int = 5) -> LocalDatasetManager:
    paths = [str(write_jsonl(tmp_path / "data" / f"part-{i}.jsonl", make_texts(7 + i, seed=i, prefix=f"f{i}")))
             for i in range(files)]
    source = LocalDatasetManager(data_files=paths)
    source.source_name = "notes"
    return source


@pytest.mark.parametrize("files", [5, 2])  # whole files per task, or row ranges of fewer files
def test_three_tasks_write_the_rows_one_task_writes_and_the_last_commits(tmp_path: Path, files: int) -> None:
    source = manager(tmp_path, files)
    statuses = [run_store_task(source, TOK, tmp_path / "tasks3", index, 3) for index in (2, 0, 1)]
    assert [s.startswith("written") for s in statuses] == [True, True, True]
    assert "store committed" in statuses[-1] and "committed" not in statuses[0]
    run_store_task(source, TOK, tmp_path / "single", 0, 1)
    assert source.setup(TOK, tmp_path / "tasks3")["input_ids"] == source.setup(TOK, tmp_path / "single")["input_ids"]
    assert source.prepare_data(TOK, tmp_path / "tasks3") == source.cache_dir_for(TOK, tmp_path / "tasks3")


def test_a_finished_task_is_skipped_and_a_committed_store_left_alone(tmp_path: Path) -> None:
    source = manager(tmp_path)
    assert run_store_task(source, TOK, tmp_path / "c", 0, 2).startswith("written")
    assert run_store_task(source, TOK, tmp_path / "c", 0, 2) == "already done"
    committed = run_store_task(source, TOK, tmp_path / "c", 1, 2)
    assert committed.endswith(f"store committed at {source.cache_dir_for(TOK, tmp_path / 'c')}")
    assert run_store_task(source, TOK, tmp_path / "c", 0, 2) == "store committed before"


def _snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(("count", "expected"), [(1, "store committed by another attempt while this one ran"),
                                                 (2, "already done by another attempt while this one ran")])
def test_a_duplicate_attempt_never_touches_the_work_another_attempt_finished_while_it_ran(
        tmp_path: Path, count: int, expected: str) -> None:
    first, duplicate = manager(tmp_path, 2), manager(tmp_path, 2)
    cache = tmp_path / "c"
    store = Path(first.cache_dir_for(TOK, cache))
    finished: dict[str, tuple[int, int]] = {}

    def load_while_the_first_attempt_finishes(*args, **kwargs):  # a requeued task while the first still runs
        run_store_task(first, TOK, cache, 0, count)
        finished.update(_snapshot(store))
        return LocalDatasetManager.load_task(duplicate, *args, **kwargs)

    duplicate.load_task = load_while_the_first_attempt_finishes
    status = run_store_task(duplicate, TOK, cache, 0, count)
    assert status.startswith(expected) and status.endswith("(its output discarded)")
    assert finished and any(name.startswith("shards/") for name in finished)
    assert _snapshot(store) == finished  # not one file of the finished work replaced
    del duplicate.load_task
    assert run_store_task(duplicate, TOK, cache, 0, count) in ("store committed before", "already done")
    assert _snapshot(store) == finished


def test_an_unfinished_store_is_refused_naming_the_missing_tasks(tmp_path: Path) -> None:
    source = manager(tmp_path)
    run_store_task(source, TOK, tmp_path / "c", 1, 3)
    with pytest.raises(StoreNotCommittedError, match=r"source 'notes' .*: the store at .* is not committed: tasks "
                                                     r"0, 2 of 3 have not finished\. Run them \(lightning-tune-data "
                                                     r"prepare --config <config> --task-index I --num-tasks 3\)"):
        source.setup(TOK, tmp_path / "c")
    with pytest.raises(StoreNotCommittedError, match=r"tasks 0, 2 of 3 have not finished"):
        source.prepare_data(TOK, tmp_path / "c")  # never silently rebuilt over other tasks' work
    with pytest.raises(StoreNotCommittedError, match=r"tasks 0, 2 of 3"):
        finalize_source_store(source, TOK, tmp_path / "c")


def test_another_task_count_against_a_partly_written_store_says_how_to_start_over(tmp_path: Path) -> None:
    source = manager(tmp_path)
    run_store_task(source, TOK, tmp_path / "c", 0, 4)
    with pytest.raises(StoreNotCommittedError, match=r"is being written by 4 tasks \(1 finished\), not 2: .* Run with "
                                                     r"--num-tasks 4, or start over after removing the store "
                                                     r"\(lightning-tune-data cache clean --cache-dir .* --store notes-[0-9a-f]{16}\)"):
        run_store_task(source, TOK, tmp_path / "c", 1, 2)


def test_finalize_commits_finished_tasks_once_and_says_when_nothing_was_written(tmp_path: Path) -> None:
    source = manager(tmp_path)
    with pytest.raises(StoreNotCommittedError, match=r"no task has written the store"):
        finalize_source_store(source, TOK, tmp_path / "c")
    with pytest.raises(CacheMissingError, match=r"no valid preprocessed cache"):
        source.setup(TOK, tmp_path / "c")
    for index in range(2):
        run_store_task(source, TOK, tmp_path / "c", index, 2)
    commit = Path(source.cache_dir_for(TOK, tmp_path / "c")) / COMPLETE_MARKER
    first = commit.read_bytes()
    commit.unlink()  # as if both tasks died right before committing
    assert finalize_source_store(source, TOK, tmp_path / "c") == "committed"
    assert commit.read_bytes() == first
    assert finalize_source_store(source, TOK, tmp_path / "c") == "committed before"


def test_a_killed_tasks_staging_folder_is_removed_when_the_task_runs_again(tmp_path: Path) -> None:
    source = manager(tmp_path)
    root = tmp_path / "c"
    name = source.cache_dir_for(TOK, root).name
    dead = root / f".{name}.task-0-of-2.tmp-999999999-abcdef12"  # no such process
    (dead / "shards").mkdir(parents=True)
    assert run_store_task(source, TOK, root, 0, 2).startswith("written")
    assert not dead.exists() and not [p for p in root.iterdir() if ".tmp-" in p.name]


def test_a_new_configuration_beside_a_partly_written_store_says_what_changed(tmp_path: Path) -> None:
    source = manager(tmp_path)
    run_store_task(source, TOK, tmp_path / "c", 0, 2)  # then the data changes before task 1 ran
    write_jsonl(tmp_path / "data" / "part-0.jsonl", make_texts(9, seed=99, prefix="edited"))
    edited = LocalDatasetManager(data_files=list(source.data_files))
    edited.source_name = "notes"
    with pytest.warns(UserWarning, match=r"source 'notes' .*: a partly written store of this source is at .*notes-\w+, "
                                         r"but data file part-0\.jsonl changed \(its content, \d+ -> \d+ bytes\), "
                                         r"so this run writes a new store at .* remove the old one "
                                         r"\(lightning-tune-data cache clean --cache-dir"):
        run_store_task(edited, TOK, tmp_path / "c", 0, 2)


def test_setup_commits_and_opens_a_local_store_whose_tasks_all_finished(tmp_path: Path) -> None:
    source = manager(tmp_path)
    for index in range(2):
        run_store_task(source, TOK, tmp_path / "c", index, 2)
    commit = Path(source.cache_dir_for(TOK, tmp_path / "c")) / COMPLETE_MARKER
    first = commit.read_bytes()
    commit.unlink()  # as if both tasks died right before committing
    assert len(source.setup(TOK, tmp_path / "c")) == sum(7 + i for i in range(5))
    assert commit.read_bytes() == first


def test_a_hard_link_to_the_data_is_another_store_and_the_error_names_the_path_it_reads(tmp_path: Path) -> None:
    source = manager(tmp_path, 1)
    run_store_task(source, TOK, tmp_path / "c", 0, 1)
    linked = tmp_path / "elsewhere" / "part-0.jsonl"
    linked.parent.mkdir()
    os.link(source.data_files[0], linked)  # same inode, same bytes, another path
    other = LocalDatasetManager(data_files=[str(linked)])
    other.source_name = "notes"
    with pytest.raises(CacheMissingError, match=r"keyed by their resolved path and their content: this configuration "
                                                rf"reads {linked}; the same files reached through another path"):
        other.setup(TOK, tmp_path / "c")


def test_a_task_shows_its_upload_to_a_remote_root(tmp_path: Path, s3, capsys) -> None:
    from lightning_tune_data.cache.root import StoreRoot

    datasets.enable_progress_bars()  # the user's default, whatever an earlier test left behind
    source = manager(tmp_path, 1)
    root = StoreRoot(s3.url, s3.storage_options, local_dir=tmp_path / "node")
    assert ", store committed at s3://" in run_store_task(source, TOK, root, 0, 1)
    err = capsys.readouterr().err
    assert f"Uploading task 0 of 1 to {s3.url}/notes-" in err and "100%" in err
