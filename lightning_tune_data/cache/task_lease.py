"""A running task's lease: proof of life in the store, so a store being written is never "stale".

While task ``i`` of ``n`` runs, it rewrites ``tasks/task-<i>-of-<n>.lease`` (host, process, time)
every :data:`HEARTBEAT_S` seconds, and removes it when it ends. ``cache list`` and ``cache clean``
call a store that is not committed *stale* only when nothing in it showed a sign of life (a lease
renewed, a task finished) for ``stale_after`` seconds (default :data:`STALE_AFTER_S`, a day: a job
array may wait in a queue for hours between its tasks).
"""

from __future__ import annotations

import os
import re
import socket
import threading
import time
from types import TracebackType

from lightning_tune_data.cache.store_files import StoreFiles
from lightning_tune_data.cache.tasks import describe_tasks, task_progress

__all__ = ["HEARTBEAT_S", "STALE_AFTER_S", "TaskLease", "last_sign_of_life", "live_tasks", "uncommitted_status"]

#: Seconds between two renewals of a running task's lease.
HEARTBEAT_S = 60.0
#: A store that is not committed is stale once it showed no sign of life for this long.
STALE_AFTER_S = 24 * 3600.0
_LEASE = re.compile(r"^task-(\d+)-of-(\d+)\.lease$")


def _duration(seconds: float) -> str:
    """``45s``, ``12m``, ``5h``, ``3d``."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _lease_path(task_index: int, num_tasks: int) -> str:
    return f"tasks/task-{task_index:05d}-of-{num_tasks:05d}.lease"


class TaskLease:
    """Hold task ``task_index`` of ``num_tasks``'s lease while the ``with`` block runs.

    Args:
        files: The store.
        task_index, num_tasks: The task.
        heartbeat_s: Seconds between renewals.
    """

    def __init__(self, files: StoreFiles, task_index: int, num_tasks: int, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.files = files
        self.path = _lease_path(task_index, num_tasks)
        self.heartbeat_s = heartbeat_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def renew(self) -> None:
        """Write the lease now (host, process id, time)."""
        self.files.write_json(self.path, {"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()})

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                self.renew()
            except OSError:  # storage briefly unreachable: the next beat tries again
                pass

    def __enter__(self) -> TaskLease:
        self.renew()
        self._thread = threading.Thread(target=self._beat, name="task-lease", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.files.delete(self.path)
        except OSError:
            pass  # a lease left behind ages out like a dead task's


def live_tasks(files: StoreFiles, stale_after_s: float = STALE_AFTER_S, now: float | None = None) -> list[int]:
    """The tasks whose lease was renewed within ``stale_after_s`` seconds (or ``2 x HEARTBEAT_S``,
    whichever is shorter: a running task renews it every minute)."""
    now = time.time() if now is None else now
    window = min(stale_after_s, 2 * HEARTBEAT_S)
    alive = []
    for name in files.listing("tasks"):
        match = _LEASE.match(name)
        if match:
            lease = files.read_json(f"tasks/{name}") or {}
            if now - float(lease.get("time") or 0) <= window:
                alive.append(int(match.group(1)))
    return sorted(alive)


def last_sign_of_life(files: StoreFiles) -> float | None:
    """When a task of the store last renewed its lease or finished (seconds since the epoch);
    ``None`` when no task left a trace."""
    times = []
    for name in files.listing("tasks"):
        if _LEASE.match(name):
            times.append(float((files.read_json(f"tasks/{name}") or {}).get("time") or 0))
        elif name.endswith(".done"):
            modified = files.modified(f"tasks/{name}")
            if modified is not None:
                times.append(modified)
    return max(times) if times else None


def uncommitted_status(files: StoreFiles, stale_after_s: float = STALE_AFTER_S,
                       now: float | None = None) -> tuple[str, bool]:
    """What a store without a commit is, for ``cache list``, and whether it is stale.

    Returns:
        ``(text, stale)``: e.g. ``("being written: task 2 running; tasks 0, 1 of 4 finished", False)``
        or ``("not committed: task 3 of 4 unfinished, no sign of life for 2d", True)``.
    """
    now = time.time() if now is None else now
    progress = task_progress(files)
    num_tasks, done = max(progress.items(), key=lambda item: len(item[1])) if progress else (0, set())
    missing = [i for i in range(num_tasks) if i not in done]
    unfinished = f"{describe_tasks(missing, num_tasks)} of {num_tasks} unfinished" if missing else "not committed"
    alive = live_tasks(files, stale_after_s, now)
    if alive:
        return f"being written: {describe_tasks(alive, num_tasks or len(alive))} running; {unfinished}", False
    last = last_sign_of_life(files)
    if last is None:
        return ("no task has written anything" if not progress else unfinished), True
    idle = _duration(max(0.0, now - last))
    if now - last < stale_after_s:
        return (f"not committed: {unfinished}, last task activity {idle} ago (stale after "
                f"{_duration(stale_after_s)} without one)"), False
    return f"not committed: {unfinished}, no sign of life for {idle}", True
