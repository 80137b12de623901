"""The shared weight table: workers read versions the main process publishes later, wait for a
missing one, and stop with an error (never hang) when the main process is gone."""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import pytest
import torch

from lightning_tune_data.mixing.weight_versions import WeightVersions


def _read(versions: WeightVersions, version: int, out: "multiprocessing.Queue") -> None:
    try:
        out.put(("ok", versions.get(version)))
    except RuntimeError as error:
        out.put(("error", str(error)))


@pytest.mark.slow
def test_a_worker_waits_for_a_version_the_main_process_publishes_later() -> None:
    versions = WeightVersions(["a", "b"], [0.5, 0.5], capacity=4)
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    worker = context.Process(target=_read, args=(versions, 1, out))
    worker.start()
    time.sleep(0.3)  # the worker is waiting now
    assert out.empty()
    versions.publish([0.25, 0.75])
    assert out.get(timeout=10) == ("ok", [0.25, 0.75])
    worker.join(10)


@pytest.mark.slow
def test_a_spawned_worker_sees_the_same_table() -> None:
    versions = WeightVersions(["a", "b"], [0.5, 0.5], capacity=4)
    versions.publish([0.1, 0.9])
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    worker = context.Process(target=_read, args=(versions, 2, out))
    worker.start()
    time.sleep(1.0)
    versions.publish([0.3, 0.7])
    assert out.get(timeout=30) == ("ok", [0.3, 0.7])
    worker.join(10)


def _main_that_dies(result: str) -> None:
    """A main process: starts a worker waiting for version 1, then dies without publishing it."""
    versions = WeightVersions(["a", "b"], [0.5, 0.5], capacity=4)

    def worker() -> None:
        try:
            versions.get(1)
            message = "returned"
        except RuntimeError as error:
            message = str(error)
        Path(result).write_text(message)

    process = multiprocessing.get_context("fork").Process(target=worker)
    process.start()
    time.sleep(0.2)
    os._exit(0)  # the main process is gone; its worker is still waiting


@pytest.mark.slow
def test_a_waiting_worker_stops_with_an_error_when_the_main_process_dies(tmp_path: Path) -> None:
    result = tmp_path / "worker.txt"
    main = multiprocessing.get_context("fork").Process(target=_main_that_dies, args=(str(result),))
    main.start()
    main.join(10)
    deadline = time.monotonic() + 20
    while not result.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert result.exists(), "the orphaned worker is still waiting"
    assert "main process" in result.read_text() and "is gone" in result.read_text()


@pytest.mark.slow
def test_a_worker_gives_up_after_the_timeout_naming_the_setting() -> None:
    versions = WeightVersions(["a", "b"], [0.5, 0.5], capacity=4, what="TextDataModule.mix_update_every=7")
    versions.wait_timeout = 0.2
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    worker = context.Process(target=_read, args=(versions, 1, out))
    worker.start()
    kind, message = out.get(timeout=10)
    worker.join(10)
    assert kind == "error" and "mix_update_every=7" in message and "0 s" in message


def test_the_main_process_never_waits_for_itself() -> None:
    versions = WeightVersions(["a", "b"], [0.5, 0.5], capacity=4)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="has not computed yet"):
        versions.get(1)
    assert time.monotonic() - started < 0.1


def test_load_replaces_the_history_and_a_full_table_says_so() -> None:
    versions = WeightVersions(["a", "b"], [1.0, 0.0], capacity=3)
    versions.publish([0.0, 1.0])
    versions.load([[0.2, 0.8], [0.4, 0.6]])
    assert len(versions) == 3 and versions.get(2) == [0.4, 0.6] and versions.get(0) == [1.0, 0.0]
    assert versions.table.is_shared() and isinstance(versions.table, torch.Tensor)
    with pytest.raises(RuntimeError, match="mix_update_every"):
        versions.publish([0.5, 0.5])
