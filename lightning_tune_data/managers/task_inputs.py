"""Which part of a source's inputs task ``i`` of ``n`` reads.

The parts are contiguous and in order, so the store's rows come out in the same global order
(inputs in their configured order, rows in file order) however many tasks write it:

* with at least as many data files as tasks, each task reads a contiguous run of whole files,
  the runs balanced by bytes;
* otherwise (one large file, a hub dataset) each task reads its contiguous range of rows of the
  loaded data.
"""

from __future__ import annotations

import bisect
import itertools
import os
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["check_task", "file_runs", "row_range", "task_part"]


def check_task(task_index: int, num_tasks: int) -> None:
    """Fail unless ``0 <= task_index < num_tasks``.

    Raises:
        ValueError: Naming both numbers.
    """
    if num_tasks < 1 or not 0 <= task_index < num_tasks:
        raise ValueError(f"task index {task_index} of {num_tasks} tasks: the index must be in 0..{num_tasks - 1} "
                         f"and the number of tasks at least 1.")


def file_runs(sizes: Sequence[int], num_tasks: int) -> list[tuple[int, int]]:
    """Split files (by their sizes, in order) into ``num_tasks`` contiguous non-empty runs of
    about equal bytes.

    Args:
        sizes: Every file's size, in the configured order (at least ``num_tasks`` files).
        num_tasks: How many runs.

    Returns:
        ``[(first, end), ...]`` file index ranges, one per task.
    """
    cumulative = list(itertools.accumulate(sizes))
    total = cumulative[-1] if cumulative else 0
    bounds = [0]
    for task in range(1, num_tasks):
        target = total * task / num_tasks
        above = bisect.bisect_left(cumulative, target) + 1  # files [0, above) hold at least the target
        below = above - 1  # files [0, below) hold less
        # the cut whose bytes are nearest the target (not the first at or above it: files of about
        # equal size would otherwise give the first task one file too many, the last one too few)
        cut = below if below > 0 and target - cumulative[below - 1] < cumulative[min(above, len(sizes)) - 1] - target \
            else above
        cut = max(cut, bounds[-1] + 1)  # every run has a file
        cut = min(cut, len(sizes) - (num_tasks - task))  # and leaves one for every later run
        bounds.append(cut)
    bounds.append(len(sizes))
    return [(bounds[i], bounds[i + 1]) for i in range(num_tasks)]


def row_range(num_rows: int, task_index: int, num_tasks: int) -> tuple[int, int]:
    """Task ``task_index``'s contiguous share ``[start, end)`` of ``num_rows`` rows."""
    return num_rows * task_index // num_tasks, num_rows * (task_index + 1) // num_tasks


def task_part(
    files: Sequence[str] | None,
    task_index: int,
    num_tasks: int,
    load_files: Callable[[list[str] | None], Any],
) -> tuple[Any, dict[str, Any]]:
    """Load task ``task_index``'s part of a source.

    Args:
        files: The source's data files in order, or ``None`` when it has none to split by.
        task_index, num_tasks: The task.
        load_files: Loads the given files (``None``: all of the source) as a ``datasets.Dataset``.

    Returns:
        ``(the part's rows, a description of the part for the task manifest)``.
    """
    check_task(task_index, num_tasks)
    if num_tasks == 1:
        return load_files(None), {"part": "all"}
    if files is not None and len(files) >= num_tasks:
        first, end = file_runs([os.path.getsize(f) for f in files], num_tasks)[task_index]
        chosen = list(files[first:end])
        return load_files(chosen), {"files": [os.path.basename(f) for f in chosen], "file_range": [first, end],
                                     "of_files": len(files)}
    dataset = load_files(None)
    start, end = row_range(len(dataset), task_index, num_tasks)
    return dataset.select(range(start, end)), {"rows": [start, end], "of_rows": len(dataset)}
