"""Where the readers of a node's shard cache are: one small file per live process."""

from __future__ import annotations

import multiprocessing
import os

from lightning_tune_data.cache.reader_positions import READERS_FOLDER, ReaderPositions


def _publish(folder, epoch, window) -> None:  # noqa: ANN001
    ReaderPositions(folder).publish(epoch, window)


def test_a_reader_sees_the_other_live_readers_positions_but_not_its_own(tmp_path):
    positions = ReaderPositions(tmp_path)
    positions.publish(0, 3)
    (tmp_path / READERS_FOLDER / f"{os.getppid()}.json").write_text("[1, 2]")  # a live process: our parent
    assert positions.others() == [(1, 2)]
    positions.publish(0, 4)  # a new window replaces the old position
    assert (tmp_path / READERS_FOLDER / f"{os.getpid()}.json").read_text() == "[0, 4]"


def test_the_positions_of_ended_processes_are_removed(tmp_path):
    process = multiprocessing.get_context("fork").Process(target=_publish, args=(tmp_path, 2, 7))
    process.start()
    process.join(30)
    ended = tmp_path / READERS_FOLDER / f"{process.pid}.json"
    assert ended.read_text() == "[2, 7]"
    assert ReaderPositions(tmp_path).others() == [] and not ended.exists()


def test_no_folder_means_no_other_readers(tmp_path):
    assert ReaderPositions(tmp_path / "missing").others() == []
