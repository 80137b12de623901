"""Who owns a leftover file: the process that holds a lock on it.

A partial download, a reader's position file and a task's staging folder are each owned by the
process that made them. Whether the owner still runs is told by a lock, not by a process id in
the name: the owner holds an exclusive ``flock`` on the file (or folder) for as long as it works
on it, and the kernel drops the lock the moment the owner ends, however it ends (SIGKILL, OOM).
A lock is seen by every process on the same kernel, whatever PID namespace (container) it runs
in, and it cannot be mistaken for another process that reused a dead owner's id.

Locks (the claims here and the shared locks a reader holds on the shards it maps) belong to the
open file: a child made by ``fork`` shares its parent's. Each lock this process holds is
registered here, and a forked child closes its inherited copies at once (so a dataloader worker
never keeps its parent's shard pinned); objects that hold more than a descriptor (a cache with
mapped shards) register a callback that forgets what they inherited.

Waiting for a lock is bounded: :func:`wait_for_lock` backs off from 1 ms to 100 ms between tries
and, past its deadline, raises :class:`LockWaitTimeout` naming the file and the process holding
it (e.g. one stopped with SIGSTOP), instead of hanging the node.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

__all__ = ["CLAIMING_SUFFIX", "LockWaitTimeout", "after_fork_in_child", "claim", "claimed", "forget_held", "hold", "is_stopped", "lock_holders",
           "release", "remove_if_unclaimed", "wait_for_lock"]

#: Suffix of a file being claimed (created and locked, not renamed into place yet).
CLAIMING_SUFFIX = ".claiming"
_held: set[int] = set()  # descriptors holding a lock of this process (closed in a forked child)
_held_guard = threading.Lock()
_at_fork: weakref.WeakKeyDictionary[object, Callable[[object], None]] = weakref.WeakKeyDictionary()


class LockWaitTimeout(TimeoutError):
    """A lock stayed held by another process longer than a bounded wait allows."""


def hold(fd: int) -> int:
    """Register ``fd`` (holding a lock) as this process's: a forked child closes its copy."""
    with _held_guard:
        _held.add(fd)
    return fd


def forget_held(fd: int) -> None:
    """Unregister ``fd`` and close it (its lock is dropped once no other descriptor shares it)."""
    with _held_guard:
        known = fd in _held
        _held.discard(fd)
    if known:
        os.close(fd)


def after_fork_in_child(owner: object, forget: Callable[[object], None]) -> None:
    """Call ``forget(owner)`` in every child this process forks (while ``owner`` lives here),
    for ``owner`` to drop what it inherited: mappings, threads' state, descriptors."""
    _at_fork[owner] = forget


def _in_child() -> None:
    global _held_guard
    _held_guard = threading.Lock()  # another thread of the parent may have held it at the fork
    for fd in list(_held):
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()
    for owner, forget in list(_at_fork.items()):
        forget(owner)


os.register_at_fork(after_in_child=_in_child)


def lock_holders(path: Path) -> list[int]:
    """The ids of the processes holding a lock on ``path`` (from ``/proc/locks``; for messages)."""
    try:
        inode = os.stat(path).st_ino
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    holders = []
    for line in lines:
        fields = line.split()
        if "->" in fields or len(fields) < 6:
            continue
        if fields[5].rsplit(":", 1)[-1] == str(inode) and fields[4].isdigit():
            holders.append(int(fields[4]))
    return sorted(set(holders))


def _process_state(pid: int) -> str | None:
    """Process ``pid``'s state as ``/proc/<pid>/status`` gives it (``"T (stopped)"``); ``None`` when gone."""
    try:
        return next(line.split(":", 1)[1].strip() for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                    if line.startswith("State:"))
    except (OSError, StopIteration):
        return None


def is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, a debugger): it holds what it holds until resumed."""
    return (_process_state(pid) or "?")[0] in ("T", "t")


def _describe_holders(path: Path) -> str:
    names = []
    for pid in lock_holders(path):
        state = _process_state(pid)
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            state = None
        names.append(f"process {pid}" if state is None else f"process {pid} ({state}: {command[:80]})")
    return ", ".join(names) if names else "another process"


def wait_for_lock(fd: int, path: Path, exclusive: bool, timeout_s: float, what: str,
                  progress: Callable[[], object] | None = None) -> None:
    """Take a lock on ``fd`` (opened on ``path``), waiting at most ``timeout_s`` seconds without progress.

    Args:
        fd: an open descriptor of the file.
        path: the file (named in the error).
        exclusive: an exclusive lock, else a shared one.
        timeout_s: the longest wait while ``progress`` reports nothing new.
        what: what the lock guards, for the error ("the download of shard x").
        progress: a value that changes while the holder works (the deadline starts again).

    Raises:
        LockWaitTimeout: the lock stayed held; names the holding processes (e.g. stopped ones).
    """
    mode = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
    delay, deadline = 0.001, time.monotonic() + timeout_s
    seen = progress() if progress is not None else None
    while True:
        try:
            fcntl.flock(fd, mode)
            return
        except BlockingIOError:
            pass
        if progress is not None:
            now = progress()
            if now != seen:
                seen, deadline = now, time.monotonic() + timeout_s
        if time.monotonic() > deadline:
            raise LockWaitTimeout(
                f"Waited {timeout_s:.0f} s for {what} ({path}), held by {_describe_holders(path)} without progress. "
                "A stopped or hung process of this node holds it: resume or end that process.")
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def claim(path: Path) -> int:
    """Create ``path`` (a file; a folder that exists is used as it is) and hold an exclusive lock
    on it: this process owns it until :func:`release` or its end. Returns the descriptor.

    A new file is created and locked under a hidden name first, then renamed into place (the
    lock stays with it): nobody ever sees ``path`` without its owner's lock."""
    if path.is_dir():
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
        return hold(fd)
    hidden = path.with_name(f".{path.name}{CLAIMING_SUFFIX}")
    fd = os.open(hidden, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(hidden, path)
    except BaseException:
        os.close(fd)
        hidden.unlink(missing_ok=True)
        raise
    return hold(fd)


def release(fd: int) -> None:
    """Give up a claim (see :func:`claim`)."""
    forget_held(fd)


def claimed(path: Path) -> bool:
    """Whether a live process owns ``path`` (holds a lock on it); ``False`` when it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def remove_if_unclaimed(path: Path) -> bool:
    """Remove ``path`` (a file or a folder) when no live process owns it; whether it was removed.
    The check and the removal happen under the lock, so an owner cannot claim it in between."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        return True
    finally:
        os.close(fd)
