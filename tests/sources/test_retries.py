"""Retries of a failing stream: which errors are transient, the bounded backoff, datasets' own retries off."""

from __future__ import annotations

import datasets
import pytest

import lightning_tune_data.sources.retries as retries
from lightning_tune_data.sources.retries import (
    MAX_BACKOFF_S,
    Reopenings,
    RetryPolicy,
    is_transient,
    stream_files,
    without_datasets_read_retries,
)


class Clock:
    """A stand-in for ``time.monotonic`` that the test moves on."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def raised_from(error: BaseException, cause: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise error from inner
    except BaseException as outer:
        return outer


def test_network_and_io_errors_are_transient_even_when_wrapped_and_others_are_not():
    assert is_transient(ConnectionError("reset")) and is_transient(TimeoutError()) and is_transient(OSError())
    assert is_transient(raised_from(RuntimeError("reading failed"), ConnectionResetError()))
    assert not is_transient(ValueError("bad row"))
    assert not is_transient(raised_from(RuntimeError("map failed"), KeyError("text")))


def test_datasets_read_retries_are_off_inside_and_restored_after_even_on_error():
    saved = datasets.config.STREAMING_READ_MAX_RETRIES
    with pytest.raises(ConnectionError):
        with without_datasets_read_retries():
            assert datasets.config.STREAMING_READ_MAX_RETRIES == 1
            raise ConnectionError
    assert datasets.config.STREAMING_READ_MAX_RETRIES == saved


def test_stream_files_names_the_first_files_and_counts_the_rest(tmp_path):
    paths = []
    for index in range(5):
        path = tmp_path / f"part{index}.jsonl"
        path.write_text('{"text": "a"}\n', encoding="utf-8")
        paths.append(str(path))
    stream = datasets.load_dataset("json", data_files=paths, split="train", streaming=True)
    named = stream_files(stream.map(lambda row: row))
    assert named.count("part") == 3 and named.endswith("... (5 files)")
    assert stream_files(object()) == "unknown files"


def test_negative_retry_settings_are_refused_naming_the_source():
    with pytest.raises(ValueError, match="Source 'web': max_retries, retry_backoff_s and retry_timeout_s must be >= 0"):
        RetryPolicy("web", -1, 1.0, 10.0)


def test_the_wait_doubles_up_to_the_cap_and_max_retries_then_ends_it(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(retries.time, "monotonic", clock)
    reopenings = Reopenings(RetryPolicy("web", 8, 10.0, 10_000.0))
    delays = [reopenings.delay_after(ConnectionError("reset"), "a.jsonl", "row 4 of pass 0") for _ in range(8)]
    assert delays == [10.0, 20.0, 40.0, MAX_BACKOFF_S, MAX_BACKOFF_S, MAX_BACKOFF_S, MAX_BACKOFF_S, MAX_BACKOFF_S]
    clock.now += 30
    with pytest.raises(RuntimeError) as info:
        reopenings.delay_after(ConnectionError("reset"), "a.jsonl", "row 4 of pass 0")
    assert str(info.value).startswith("Source 'web': reading the stream from a.jsonl failed at row 4 of pass 0 with "
                                      "ConnectionError: reset, and kept failing after 8 re-opens with backoff "
                                      "(max_retries=8) over 30.0s.")
    assert isinstance(info.value.__cause__, ConnectionError)


def test_a_wait_that_would_pass_the_timeout_ends_it_and_after_a_success_a_new_failure_has_the_whole_budget(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(retries.time, "monotonic", clock)
    reopenings = Reopenings(RetryPolicy("web", 5, 1.0, 2.5))
    assert reopenings.delay_after(OSError("down"), "f", "row 0 of pass 1") == 1.0
    clock.now += 1.0  # the next wait (2 s) would end 3 s after the first failure
    with pytest.raises(RuntimeError, match=r"after 1 re-opens with backoff \(retry_timeout_s=2.5 would be exceeded\) "
                                           r"over 1.0s"):
        reopenings.delay_after(OSError("down"), "f", "row 0 of pass 1")
    reopenings.count = 0  # the stream read a row group again
    assert reopenings.delay_after(OSError("down"), "f", "row 9 of pass 1") == 1.0
    assert reopenings.first_failure_at == clock.now and reopenings.count == 1


def test_an_error_that_is_not_transient_ends_the_stream_at_once_naming_the_files():
    reopenings = Reopenings(RetryPolicy("web", 3, 1.0, 10.0))
    with pytest.raises(RuntimeError, match=r"the datasets stream \(a.jsonl\) failed at row 5 of pass 0 \(ValueError: "
                                           r"tokenizer exploded\)\. Errors inside the stream"):
        reopenings.delay_after(ValueError("tokenizer exploded"), "a.jsonl", "row 5 of pass 0")
    assert reopenings.count == 0
