"""Owners of leftover files: a lock held on the file, seen by every process of the kernel; locks
closed in forked children; bounded waits that name a stopped holder."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import signal
import time

import pytest

from lightning_tune_data.cache.owners import (
    LockWaitTimeout, claim, claimed, hold, lock_holders, release, remove_if_unclaimed, wait_for_lock,
)

FORK = multiprocessing.get_context("fork")


def _claim_and_wait(path, ready, done) -> None:  # noqa: ANN001
    claim(path)
    ready.set()
    done.wait(30)


def test_a_claimed_file_is_owned_while_its_owner_lives_and_removable_once_it_is_killed(tmp_path):
    path = tmp_path / "download.partial-10-abc"
    ready, done = FORK.Event(), FORK.Event()
    owner = FORK.Process(target=_claim_and_wait, args=(path, ready, done))
    owner.start()
    assert ready.wait(30)
    assert claimed(path) and not remove_if_unclaimed(path) and path.exists()
    assert lock_holders(path) == [owner.pid]
    os.kill(owner.pid, signal.SIGKILL)  # however it ends, the kernel drops its lock
    owner.join(30)
    assert not claimed(path)
    assert remove_if_unclaimed(path) and not path.exists()


def test_a_claim_is_never_seen_without_its_lock_and_release_gives_it_up(tmp_path):
    path = tmp_path / "position.pos"
    fd = claim(path)
    assert claimed(path) and not list(tmp_path.glob(".*"))  # created under a hidden name, renamed locked
    release(fd)
    assert not claimed(path) and path.exists()
    folder = tmp_path / "staging"
    folder.mkdir()
    fd = claim(folder)  # a folder is claimed in place
    assert claimed(folder) and not remove_if_unclaimed(folder)
    release(fd)
    assert remove_if_unclaimed(folder) and not folder.exists()


def _report_lock(path, results) -> None:  # noqa: ANN001
    results.put(claimed(path))


def test_a_forked_child_closes_the_locks_it_inherits(tmp_path):
    path = tmp_path / "shard.arrow"
    path.write_bytes(b"x")
    fd = hold(os.open(path, os.O_RDONLY))
    fcntl.flock(fd, fcntl.LOCK_SH)
    results = FORK.Queue()
    ready, done = FORK.Event(), FORK.Event()
    child = FORK.Process(target=_claim_and_wait, args=(tmp_path / "other", ready, done))
    child.start()
    assert ready.wait(30)
    release(fd)  # the parent lets go: no copy of the lock stays with the child
    try:
        probe = os.open(path, os.O_RDONLY)
        fcntl.flock(probe, fcntl.LOCK_EX | fcntl.LOCK_NB)  # would fail if the child still held the shared lock
        os.close(probe)
    finally:
        done.set()
        child.join(30)
    reporter = FORK.Process(target=_report_lock, args=(path, results))
    reporter.start()
    assert results.get(timeout=30) is False
    reporter.join(30)


def test_a_stopped_lock_holder_gives_a_bounded_wait_naming_it(tmp_path):
    path = tmp_path / "room.lock"
    ready, done = FORK.Event(), FORK.Event()
    holder = FORK.Process(target=_claim_and_wait, args=(path, ready, done))
    holder.start()
    assert ready.wait(30)
    os.kill(holder.pid, signal.SIGSTOP)
    fd = os.open(path, os.O_RDONLY)
    try:
        started = time.monotonic()
        with pytest.raises(LockWaitTimeout, match=rf"room\.lock.*process {holder.pid} \(T \(stopped\)"):
            wait_for_lock(fd, path, True, 0.5, "the room")
        assert 0.5 <= time.monotonic() - started < 5
    finally:
        os.close(fd)
        os.kill(holder.pid, signal.SIGCONT)
        done.set()
        holder.join(30)


def test_a_wait_goes_on_while_the_holder_makes_progress(tmp_path):
    path = tmp_path / "download.lock"
    ready, done = FORK.Event(), FORK.Event()
    holder = FORK.Process(target=_claim_and_wait, args=(path, ready, done))
    holder.start()
    assert ready.wait(30)
    ticks = iter(range(1_000_000))
    fd = os.open(path, os.O_RDONLY)
    try:
        started = time.monotonic()
        deadline = started + 1.0

        def progress() -> int:  # the holder's download grows for 1 s, then the holder ends
            if time.monotonic() > deadline:
                done.set()
            return next(ticks)

        wait_for_lock(fd, path, True, 0.3, "a download", progress=progress)
        assert time.monotonic() - started >= 1.0
    finally:
        os.close(fd)
        done.set()
        holder.join(30)


def test_is_stopped_tells_a_stopped_process_from_a_running_one() -> None:
    import signal
    import subprocess
    import sys

    from lightning_tune_data.cache.owners import is_stopped

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not is_stopped(child.pid)
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not is_stopped(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert is_stopped(child.pid)
        os.kill(child.pid, signal.SIGCONT)
        deadline = time.monotonic() + 10
        while is_stopped(child.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not is_stopped(child.pid)
    finally:
        child.kill()
        child.wait()
    assert not is_stopped(child.pid), "an ended process is not stopped"
