"""Where the readers of a node's shard cache are: one small file per live process, owned through a lock."""

from __future__ import annotations

import multiprocessing
import os
import time

from lightning_tune_data.cache import reader_positions
from lightning_tune_data.cache.reader_positions import READERS_FOLDER, ReaderPositions

FORK = multiprocessing.get_context("fork")


def _publish(folder, epoch, window) -> None:  # noqa: ANN001
    ReaderPositions(folder).publish(epoch, window)


def _publish_and_wait(folder, epoch, window, ready, done) -> None:  # noqa: ANN001
    ReaderPositions(folder).publish(epoch, window)
    ready.set()
    done.wait(30)


def test_a_reader_sees_the_other_live_readers_positions_but_not_its_own(tmp_path):
    positions = ReaderPositions(tmp_path)
    positions.publish(0, 3)
    ready, done = FORK.Event(), FORK.Event()
    other = FORK.Process(target=_publish_and_wait, args=(tmp_path, 1, 2, ready, done))
    other.start()
    try:
        assert ready.wait(30)
        assert positions.others() == [(1, 2)]
        positions.publish(0, 4)  # a new window replaces the old position
        assert sorted(ReaderPositions(tmp_path).others()) == [(0, 4), (1, 2)]
        assert positions.any_live()
    finally:
        done.set()
        other.join(30)
    assert len(list((tmp_path / READERS_FOLDER).glob("*.pos"))) == 2  # the ended reader's file stays until looked at


def test_the_positions_of_ended_processes_are_removed_whatever_process_id_they_had(tmp_path):
    process = FORK.Process(target=_publish, args=(tmp_path, 2, 7))
    process.start()
    process.join(30)
    [ended] = (tmp_path / READERS_FOLDER).glob("*.pos")
    assert ended.read_bytes().strip() == b"[2, 7]"
    assert ReaderPositions(tmp_path).others() == [] and not ended.exists()
    assert not ReaderPositions(tmp_path).any_live()


def test_a_position_not_written_for_a_long_time_is_ignored_and_a_closed_reader_leaves_nothing(tmp_path, monkeypatch):
    idle = ReaderPositions(tmp_path)
    idle.publish(0, 1)
    reader = ReaderPositions(tmp_path)
    assert reader.others() == [(0, 1)]
    monkeypatch.setattr(reader_positions, "POSITION_TTL_S", 0.05)
    time.sleep(0.1)
    assert reader.others() == []  # alive, but it stopped reading the store
    idle.close()
    assert not list((tmp_path / READERS_FOLDER).iterdir())


def test_no_folder_means_no_other_readers(tmp_path):
    assert ReaderPositions(tmp_path / "missing").others() == []


def test_a_full_disk_does_not_stop_a_reader(tmp_path):
    positions = ReaderPositions(tmp_path)
    (tmp_path / READERS_FOLDER).write_text("not a folder")  # the position file cannot be made
    positions.publish(0, 1)
    assert positions.others() == [] and os.path.isfile(tmp_path / READERS_FOLDER)
