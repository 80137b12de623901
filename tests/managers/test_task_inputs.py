"""Task parts: contiguous runs of whole files balanced by bytes, or contiguous row ranges, so the
rows come out in the same order for any number of tasks."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest

from lightning_tune_data.managers.task_inputs import check_task, file_runs, row_range, task_part


@pytest.mark.parametrize(("sizes", "tasks"), [([1] * 10, 4), ([100, 1, 1, 1], 4), ([1, 1, 1, 100], 2),
                                              ([5] * 5, 5), ([3, 1, 1, 1, 1, 1], 3), ([0, 0, 0], 2),
                                              ([7, 1, 9, 2, 2, 8, 1], 3)])
def test_file_runs_are_contiguous_non_empty_and_cover_every_file(sizes: list[int], tasks: int) -> None:
    runs = file_runs(sizes, tasks)
    assert len(runs) == tasks and runs[0][0] == 0 and runs[-1][1] == len(sizes)
    assert all(first < end for first, end in runs)
    assert all(runs[i][1] == runs[i + 1][0] for i in range(tasks - 1))


def test_file_runs_balance_bytes() -> None:
    assert file_runs([1] * 8, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert file_runs([10] + [1] * 10, 2) == [(0, 1), (1, 11)]


def test_files_of_about_equal_size_split_evenly() -> None:
    # JSONL files of "equal" size differ by a few bytes: the first task must not get 3 of 8 and the last 1
    sizes = [1000, 999, 1001, 1000, 998, 1002, 1000, 1000]
    assert file_runs(sizes, 4) == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert file_runs(sizes, 2) == [(0, 4), (4, 8)]


def test_row_ranges_cover_every_row_once() -> None:
    assert [row_range(10, i, 4) for i in range(4)] == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert [row_range(2, i, 4) for i in range(4)] == [(0, 0), (0, 1), (1, 1), (1, 2)]


def test_a_task_outside_the_task_count_is_refused() -> None:
    with pytest.raises(ValueError, match=r"task index 4 of 4 tasks: the index must be in 0\.\.3"):
        check_task(4, 4)
    with pytest.raises(ValueError):
        check_task(0, 0)


def test_a_task_reads_whole_files_when_there_are_enough_else_a_row_range(tmp_path: Path) -> None:
    files = []
    for index in range(3):
        path = tmp_path / f"part-{index}.txt"
        path.write_text("x" * 10)
        files.append(str(path))
    asked: list = []

    def load(chosen: list[str] | None) -> datasets.Dataset:
        asked.append(chosen)
        return datasets.Dataset.from_dict({"row": list(range(9))})

    part, described = task_part(files, 1, 3, load)
    assert asked[-1] == [files[1]] and described == {"files": ["part-1.txt"], "file_range": [1, 2], "of_files": 3}
    part, described = task_part(files, 1, 4, load)  # fewer files than tasks: rows
    assert asked[-1] is None and described == {"rows": [2, 4], "of_rows": 9} and part["row"] == [2, 3]
    part, described = task_part(files, 0, 1, load)
    assert described == {"part": "all"} and len(part) == 9
