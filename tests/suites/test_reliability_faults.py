"""Faults: killed and concurrent prepare_data, corrupt caches, failing dataloader workers and a
flaky HTTP server under a streaming source (issue 7). Real processes, real caches, a real
local HTTP server; every wait is bounded in time."""

from __future__ import annotations

import http.server
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import datasets
import psutil
import pytest
from conftest import make_texts, write_jsonl
from lightning.pytorch import Trainer

from lightning_tune_data import ByteTokenizer, DatasetManager, LocalDatasetManager, TextDataModule
from lightning_tune_data.managers import CacheMissingError
from lightning_tune_data.models import TinyCausalLM
from lightning_tune_data.sources.hf_streaming import HFStreamingSource

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))
from reliability_prepare import make_datamodule  # noqa: E402

TOKENIZER = ByteTokenizer()
TEXTS = make_texts(40, seed=3, prefix="P")


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def start_prepare(data_file: Path, cache_dir: Path, log: Path, sleep_s: float) -> subprocess.Popen:
    env = {**os.environ, "RELIABILITY_LOG": str(log), "RELIABILITY_SLEEP": str(sleep_s)}
    return subprocess.Popen([sys.executable, str(SCRIPTS / "reliability_prepare.py"), str(data_file), str(cache_dir)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def source_of(dm: TextDataModule):
    return dm.dataset_managers["train"]["src"]


def cached_texts(dm: TextDataModule, cache_dir: Path) -> list[str]:
    return [TOKENIZER.decode(ids) for ids in source_of(dm).setup(TOKENIZER, cache_dir)["input_ids"]]


# -- prepare_data ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(180)
def test_prepare_data_killed_mid_build_leaves_no_cache_and_the_next_run_rebuilds_cleanly(tmp_path):
    data, cache_dir, log = write_jsonl(tmp_path / "a.jsonl", TEXTS), tmp_path / "cache", tmp_path / "calls.log"
    process = start_prepare(data, cache_dir, log, sleep_s=120)
    try:
        wait_for(lambda: log.exists() and log.read_text().strip(), 60, "the build to start preprocessing")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    dm = make_datamodule(str(data), str(cache_dir))
    with pytest.raises(CacheMissingError, match="no valid preprocessed cache"):
        source_of(dm).setup(TOKENIZER, cache_dir)
    assert [p for p in cache_dir.iterdir() if ".tmp-" in p.name], "the killed build's temporary directory"

    dm.prepare_data()  # this process: RELIABILITY_LOG unset, so no sleeping
    assert not [p for p in cache_dir.iterdir() if ".tmp-" in p.name]
    assert cached_texts(dm, cache_dir) == TEXTS


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_concurrent_prepare_data_builds_once_and_the_other_process_waits_and_reuses(tmp_path):
    data, cache_dir, log = write_jsonl(tmp_path / "a.jsonl", TEXTS), tmp_path / "cache", tmp_path / "calls.log"
    first = start_prepare(data, cache_dir, log, sleep_s=1.5)
    wait_for(lambda: log.exists() and log.read_text().strip(), 60, "the first build to start")
    second = start_prepare(data, cache_dir, log, sleep_s=1.5)  # starts while the first holds the lock
    outputs = []
    for process in (first, second):
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err[-3000:]
        outputs.append(json.loads(out.strip().splitlines()[-1]))
    builders = set(log.read_text().split())
    assert builders == {str(first.pid)}, "only the first process ran the preprocessing"
    assert [o["rows"] for o in outputs] == [len(TEXTS), len(TEXTS)]


# -- corrupt caches ------------------------------------------------------------------------
def arrow_file(dm: TextDataModule, cache_dir: Path) -> Path:
    return next((source_of(dm).cache_dir_for(TOKENIZER, cache_dir) / "shards").rglob("*.arrow"))


@pytest.mark.parametrize("damage", ["truncate", "overwrite_header"])
def test_corrupt_cache_is_detected_and_rebuilt_with_a_warning_by_the_trainer(tmp_path, damage):
    data, cache_dir = write_jsonl(tmp_path / "a.jsonl", TEXTS), tmp_path / "cache"
    dm = make_datamodule(str(data), str(cache_dir))
    dm.prepare_data()
    arrow = arrow_file(dm, cache_dir)
    content = arrow.read_bytes()
    arrow.write_bytes(content[: len(content) // 2] if damage == "truncate" else b"\0" * 64 + content[64:])

    with pytest.raises(CacheMissingError, match=rf"cache at .* is corrupt \(.*\)\. Run prepare_data again"):
        source_of(dm).setup(TOKENIZER, cache_dir)  # setup never builds: it refuses the corrupt cache

    dm = make_datamodule(str(data), str(cache_dir))
    model = TinyCausalLM(vocab_size=dm.vocab_size, max_seq_len=32, d_model=16, n_layers=1, n_heads=2)
    trainer = Trainer(accelerator="cpu", max_steps=2, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    with pytest.warns(UserWarning, match=r"Removing invalid cache .* \(corrupt: .*\); rebuilding it"):
        trainer.fit(model, datamodule=dm)
    assert trainer.global_step == 2
    assert cached_texts(dm, cache_dir) == TEXTS


# -- a dataloader worker that raises ------------------------------------------------------
def fit_until_a_worker_fails(tmp_path: Path) -> tuple[str, set[int]]:
    """Fit until a worker's transform exceeds the error budget; the error message and the pids of
    the processes the fit started."""
    texts = [f"BOOM {i}" if i % 3 == 0 else f"fine {i}" for i in range(48)]
    source = LocalDatasetManager(data_files=str(write_jsonl(tmp_path / "a.jsonl", texts)), max_error_count=1,
                                 model_transform="reliability_fns.raise_on_boom")
    dm = TextDataModule(dataset_managers={"train": {"src": source}}, max_seq_len=32, batch_size=4, num_workers=2,
                        cache_dir=str(tmp_path / "cache"))
    model = TinyCausalLM(vocab_size=dm.vocab_size, max_seq_len=32, d_model=16, n_layers=1, n_heads=2)
    trainer = Trainer(accelerator="cpu", max_steps=50, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    before = {child.pid for child in psutil.Process().children(recursive=True)}
    with pytest.raises(RuntimeError) as info:
        trainer.fit(model, datamodule=dm)
    started = {child.pid for child in psutil.Process().children(recursive=True)} - before
    return str(info.value), started


def exited(pids: set[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_whose_transform_fails_past_the_budget_raises_in_the_main_process_with_its_traceback(tmp_path):
    # No hang: the error reaches the main process well inside the test's timeout marker.
    message, started = fit_until_a_worker_fails(tmp_path)
    assert "Caught RuntimeError in DataLoader worker process" in message
    assert "Source 'src': 2 samples failed their transforms, more than max_error_count=1" in message
    assert "in raise_on_boom" in message and "ValueError: raise_on_boom: this document is broken" in message
    # Lightning's teardown after the error stops this fit's dataloader workers (none is left idle).
    wait_for(lambda: exited(started), 10, "the dataloader workers to exit")


# -- a flaky HTTP server under a streaming source -----------------------------------------
class FlakyServer:
    """Serves JSONL files on 127.0.0.1 (with range requests); ``fail`` decides, per GET, whether
    to answer 503 or to drop the connection after a third of the body."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.fail: Callable[[str], str | None] = lambda path: None
        self.failures: list[tuple[str, str]] = []
        self.slow_s = 5.0
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _reply(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for key, value in {**headers, "Content-Length": str(len(body))}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(body)

            def do_HEAD(self) -> None:
                body = server.files.get(self.path)
                self.send_response(200 if body is not None else 404)
                self.send_header("Content-Length", str(len(body or b"")))
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()

            def do_GET(self) -> None:
                body = server.files.get(self.path)
                if body is None:
                    return self._reply(404, b"", {})
                mode = server.fail(self.path)
                if mode == "slow":  # say nothing for a long while, then answer normally
                    server.failures.append((self.path, mode))
                    time.sleep(server.slow_s)
                if mode == "503":
                    server.failures.append((self.path, mode))
                    return self._reply(503, b"", {})
                start, end = 0, len(body) - 1
                if self.headers.get("Range"):
                    first, last = self.headers["Range"].split("=")[1].split("-")
                    start, end = int(first), int(last) if last else len(body) - 1
                chunk = body[start : end + 1]
                if mode == "drop":
                    server.failures.append((self.path, mode))
                    self.send_response(206)
                    self.send_header("Content-Length", str(len(chunk)))
                    self.end_headers()
                    self.wfile.write(chunk[: len(chunk) // 3])
                    self.close_connection = True
                    return None
                return self._reply(206, chunk, {"Content-Range": f"bytes {start}-{end}/{len(body)}",
                                                "Accept-Ranges": "bytes"})

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_port}{path}"

    def fail_next(self, path: str, count: int, mode: str) -> None:
        """Fail the next ``count`` GETs of ``path`` with ``mode``."""
        remaining = {"n": count}

        def fail(requested: str) -> str | None:
            if requested == path and remaining["n"] > 0:
                remaining["n"] -= 1
                return mode
            return None

        self.fail = fail

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def flaky_server(monkeypatch, caplog):
    caplog.set_level(logging.WARNING, logger="lightning_tune_data.sources.hf_streaming")
    # datasets' own read retries (20 x 5 s by default) are made short, so the source's own
    # bounded retry (and its final error) is reached quickly.
    monkeypatch.setattr(datasets.config, "STREAMING_READ_MAX_RETRIES", 1)
    monkeypatch.setattr(datasets.config, "STREAMING_READ_RETRY_INTERVAL", 0.01)
    files = {f"/part{k}.jsonl": "".join(json.dumps({"text": f"part{k} doc {i}"}) + "\n" for i in range(30)).encode()
             for k in range(2)}
    server = FlakyServer(files)
    yield server
    server.close()


EXPECTED = [f"part{k} doc {i}" for k in range(2) for i in range(30)]


def streamed_texts(source: HFStreamingSource) -> list[str]:
    return [TOKENIZER.decode(sample["input_ids"].tolist()) for sample in source]


def tokenized_stream(server: FlakyServer):
    """``load_dataset("json", <URLs>, streaming=True)`` tokenized row by row (no read-ahead)."""
    stream = datasets.load_dataset("json", data_files=[server.url("/part0.jsonl"), server.url("/part1.jsonl")],
                                   split="train", streaming=True)
    return stream.map(lambda row: {"input_ids": [TOKENIZER.bos_id, *TOKENIZER.encode(row["text"]), TOKENIZER.eos_id]},
                      remove_columns=["text"])


@pytest.mark.parametrize("mode", ["drop", "503"])
@pytest.mark.timeout(60)
def test_stream_from_a_manager_survives_failing_requests_without_losing_or_repeating_rows(flaky_server, tmp_path, mode):
    manager = DatasetManager(path="json", split="train", streaming=True,
                             data_files=[flaky_server.url("/part0.jsonl"), flaky_server.url("/part1.jsonl")])
    manager.source_name = "web"
    data = manager.setup(TOKENIZER, tmp_path / "cache")
    flaky_server.fail_next("/part1.jsonl", count=2, mode=mode)
    source = HFStreamingSource(data, "web", shuffle=False, num_passes=1, max_retries=3, retry_backoff_s=0.05)
    assert streamed_texts(source) == EXPECTED
    assert len(flaky_server.failures) == 2


@pytest.mark.timeout(60)
def test_stream_failing_mid_pass_is_reopened_at_the_last_consumed_row(flaky_server):
    # Row-by-row tokenization: 30 rows of part0 are consumed before part1's request fails.
    source = HFStreamingSource(tokenized_stream(flaky_server), "web", shuffle=False, num_passes=1,
                               max_retries=3, retry_backoff_s=0.05)
    rows = iter(source)
    first = [TOKENIZER.decode(next(rows)["input_ids"].tolist()) for _ in range(30)]
    flaky_server.fail_next("/part1.jsonl", count=2, mode="drop")
    rest = [TOKENIZER.decode(sample["input_ids"].tolist()) for sample in rows]
    assert first + rest == EXPECTED
    assert len(flaky_server.failures) == 2


@pytest.mark.parametrize("mode", ["drop", "503"])
@pytest.mark.timeout(60)
def test_stream_whose_server_keeps_failing_raises_naming_source_url_and_retries(flaky_server, caplog, mode):
    source = HFStreamingSource(tokenized_stream(flaky_server), "web", shuffle=False, num_passes=1,
                               max_retries=2, retry_backoff_s=0.05)
    flaky_server.fail_next("/part1.jsonl", count=10**6, mode=mode)
    with pytest.raises(RuntimeError) as info:  # bounded: the timeout marker guards against a hang
        streamed_texts(source)
    message = str(info.value)
    assert "Source 'web'" in message and flaky_server.url("/part1.jsonl") in message
    assert "failed at row 30 of pass 0" in message and "after 2 re-opens with backoff (max_retries=2)" in message
    reopens = [r.getMessage() for r in caplog.records if r.name == "lightning_tune_data.sources.hf_streaming"]
    assert len(reopens) == 2 and "in 0.05s [1/2]" in reopens[0] and "in 0.10s [2/2]" in reopens[1]  # backoff doubles
    requests = len(flaky_server.failures)
    time.sleep(0.3)
    assert len(flaky_server.failures) == requests, "no request after the error"


# -- streaming: our own bounded retries, preprocessing failures skipped and counted ----------
@pytest.fixture
def server_with_default_datasets_retries(caplog):
    """The flaky server, with ``datasets``' own read retries left at their defaults (20 x 5 s)."""
    caplog.set_level(logging.WARNING, logger="lightning_tune_data.sources.hf_streaming")
    assert datasets.config.STREAMING_READ_MAX_RETRIES == 20
    files = {f"/part{k}.jsonl": "".join(json.dumps({"text": f"part{k} doc {i}"}) + "\n" for i in range(30)).encode()
             for k in range(2)}
    server = FlakyServer(files)
    yield server
    server.close()


def streaming_manager(server: FlakyServer, **kwargs) -> DatasetManager:
    manager = DatasetManager(path="json", split="train", streaming=True,
                             data_files=[server.url("/part0.jsonl"), server.url("/part1.jsonl")], **kwargs)
    manager.source_name = "web"
    return manager


@pytest.mark.timeout(60)
def test_a_server_that_keeps_dropping_fails_within_our_retry_bounds_not_after_datasets_own_retries(
        server_with_default_datasets_retries, tmp_path, caplog):
    server = server_with_default_datasets_retries
    source = HFStreamingSource(tokenized_stream(server), "web", shuffle=False, num_passes=1, max_retries=2,
                               retry_backoff_s=0.05)
    server.fail_next("/part1.jsonl", count=10**6, mode="drop")
    with pytest.raises(RuntimeError, match=r"after 2 re-opens with backoff \(max_retries=2\)"):
        streamed_texts(source)  # datasets alone would wait 20 x 5 s per attempt: the timeout marker catches that
    # 3 attempts (fsspec sends up to 2 GETs per attempt); datasets' own retries would add 19 per attempt
    assert 3 <= len(server.failures) <= 6
    assert datasets.config.STREAMING_READ_MAX_RETRIES == 20  # restored for everyone else


@pytest.mark.timeout(60)
def test_retries_stop_when_the_total_retry_time_is_used_up(server_with_default_datasets_retries):
    server = server_with_default_datasets_retries
    source = HFStreamingSource(tokenized_stream(server), "web", shuffle=False, num_passes=1, max_retries=100,
                               retry_backoff_s=0.2, retry_timeout_s=1.0)
    server.fail_next("/part1.jsonl", count=10**6, mode="503")
    with pytest.raises(RuntimeError, match=r"re-opens with backoff \(retry_timeout_s=1 would be exceeded\)"):
        streamed_texts(source)
    assert 2 <= len(server.failures) <= 5  # 0.2 + 0.4 s of backoff fit in 1 s, 0.8 s more would not


@pytest.mark.timeout(60)
def test_a_silent_server_times_out_after_read_timeout_s_and_the_retry_loses_no_rows(
        server_with_default_datasets_retries, tmp_path):
    server = server_with_default_datasets_retries
    manager = streaming_manager(server, stream_retries={"read_timeout_s": 0.5, "retry_backoff_s": 0.05})
    data = manager.setup(TOKENIZER, tmp_path / "cache")
    server.fail_next("/part1.jsonl", count=1, mode="slow")
    source = HFStreamingSource(data, "web", shuffle=False, num_passes=1, **manager.stream_options())
    assert streamed_texts(source) == EXPECTED
    assert server.failures == [("/part1.jsonl", "slow")]


def test_stream_retries_are_validated_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"stream_retries must be a mapping with keys among"):
        LocalDatasetManager(data_files=str(write_jsonl(tmp_path / "a.jsonl", TEXTS)), stream_retries={"retries": 1})
    with pytest.raises(ValueError, match=r"stream_retries.read_timeout_s must be a number >= 0"):
        LocalDatasetManager(data_files=str(tmp_path / "a.jsonl"), stream_retries={"read_timeout_s": -1})


@pytest.mark.timeout(120)
def test_a_row_failing_in_a_streaming_sources_preprocessing_is_skipped_and_counted_within_max_error_count(tmp_path):
    texts = [f"BOOM {i}" if i in (4, 11) else f"fine {i}" for i in range(24)]
    data = write_jsonl(tmp_path / "a.jsonl", texts)

    def stream(budget: int) -> HFStreamingSource:
        manager = LocalDatasetManager(data_files=str(data), streaming=True, max_error_count=budget,
                                      preprocess_function="reliability_fns.tokenize_unless_boom")
        manager.source_name = "notes"
        return HFStreamingSource(manager.setup(TOKENIZER, tmp_path / "cache"), "notes", shuffle=False,
                                 num_passes=1, max_error_count=budget)

    tolerant = stream(2)
    assert [TOKENIZER.decode(s["input_ids"].tolist()) for s in tolerant] == [t for t in texts if "BOOM" not in t]
    assert tolerant.state_dict()["notes"]["errors"] == 2
    with pytest.raises(RuntimeError, match=r"(?s)2 rows could not be read.*max_error_count=1.*stream row 4.*"
                                           r"preprocessing failed.*row 4.*boom"):
        list(stream(1))
