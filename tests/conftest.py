"""Shared fixtures: small generated text corpora on disk and a callback that records batches."""

from __future__ import annotations

import json
import logging
import os
import random
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback


def make_texts(count: int, seed: int, prefix: str = "", min_words: int = 2, max_words: int = 40) -> list[str]:
    """``count`` distinct texts with varied lengths (a ``prefix`` tells sources apart)."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "data", "stream", "resume", "token", "pack", "mix", "rank", "worker"]
    return [f"{prefix}{i}: " + " ".join(rng.choice(words) for _ in range(rng.randint(min_words, max_words))) for i in range(count)]


def write_jsonl(path: Path, texts: list[str], column: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for text in texts:
            handle.write(json.dumps({column: text}) + "\n")
    return path


def flip_keeping_stamp(path: Path) -> None:
    """Flip one bit in the middle of a file and restore its modification time: a corruption that
    keeps the file's size and stamp."""
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def assert_valid_png(path: Path) -> None:
    """``path`` is a readable PNG of at least 100 x 100 pixels that is not blank."""
    import matplotlib.image
    import numpy as np
    from PIL import Image

    with Image.open(path) as image:
        image.verify()
        assert image.format == "PNG"
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert float(np.std(pixels)) > 0.01, f"{path.name} is blank"


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    """Two small JSONL sources (``a``: 61 docs, ``b``: 47 docs) and a val file."""
    write_jsonl(tmp_path / "a.jsonl", make_texts(61, seed=1, prefix="A"))
    write_jsonl(tmp_path / "b.jsonl", make_texts(47, seed=2, prefix="B"))
    write_jsonl(tmp_path / "val.jsonl", make_texts(13, seed=3, prefix="V"))
    return tmp_path


class BatchRecorder(Callback):
    """Records (global step, batch tensors) of every batch the model trains on."""

    def __init__(self) -> None:
        self.batches: list[dict[str, torch.Tensor]] = []
        self.steps: list[int] = []
        self.provenance: list[dict] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        self.steps.append(trainer.global_step)
        self.batches.append({k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)})
        self.provenance.append({k: list(v) for k, v in batch.get("provenance", {}).items()})


# -- a real S3 API on 127.0.0.1 (moto's server) ------------------------------------------------
class S3Requests:
    """WSGI middleware of the test S3 server: records ``(method, path)`` of every request served."""

    def __init__(self, app) -> None:  # noqa: ANN001
        self.app = app
        self.log: list[tuple[str, str]] = []

    def __call__(self, environ, start_response):  # noqa: ANN001, ANN204
        self.log.append((environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", "")))
        return self.app(environ, start_response)

    def gets(self, path_part: str) -> int:
        """How many GET requests so far were for a path containing ``path_part``."""
        return sum(1 for method, path in self.log if method == "GET" and path_part in path)


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server on 127.0.0.1 (a free port), for the whole session: yields
    ``(endpoint_url, S3Requests)``; the request log sees every request any process sends it."""
    from moto.server import DomainDispatcherApplication, MotoRequestHandler, ThreadedMotoServer, create_backend_app
    from werkzeug.serving import make_server

    requests_seen: list[S3Requests] = []

    class RecordingServer(ThreadedMotoServer):
        def _server_entry(self) -> None:
            app = S3Requests(DomainDispatcherApplication(create_backend_app))
            requests_seen.append(app)
            self._server = make_server(self._ip_address, self._port, app, True, request_handler=MotoRequestHandler)
            self._server_ready_event.set()
            self._server.serve_forever()

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = RecordingServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}", requests_seen[0]
    finally:
        server.stop()


S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


class S3Place:
    """One test's own bucket and prefix on the test S3 server.

    Attributes:
        endpoint: The server's URL.
        bucket, prefix: Where the test writes.
        url: ``s3://<bucket>/<prefix>``: a ``cache_dir``.
        storage_options: The s3fs options reaching the server.
        requests: The server's request log.
    """

    def __init__(self, endpoint: str, bucket: str, prefix: str, requests: S3Requests) -> None:
        import boto3

        self.endpoint, self.bucket, self.prefix, self.requests = endpoint, bucket, prefix, requests
        self.url = f"s3://{bucket}/{prefix}"
        self.storage_options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
        self.client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                   aws_access_key_id="testing", aws_secret_access_key="testing")

    def keys(self) -> list[str]:
        """Every object key under the prefix, relative to it, sorted."""
        keys: list[str] = []
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix + "/"):
            keys += [item["Key"][len(self.prefix) + 1:] for item in page.get("Contents", [])]
        return sorted(keys)

    def get(self, key: str) -> bytes:
        """An object's bytes (``key`` relative to the prefix)."""
        return self.client.get_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}")["Body"].read()

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}", Body=data)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=f"{self.prefix}/{key}")


@pytest.fixture
def s3(s3_server, monkeypatch, request) -> S3Place:
    """A fresh bucket and prefix for this test (s3fs caches listings and filesystems, so no two
    tests share a path); the AWS environment points at the test server's fake credentials."""
    import re
    import uuid

    for name, value in S3_ENV.items():
        monkeypatch.setenv(name, value)
    endpoint, requests_seen = s3_server
    bucket = "t-" + uuid.uuid4().hex[:16]
    place = S3Place(endpoint, bucket, re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40] + "-" +
                    uuid.uuid4().hex[:8], requests_seen)
    place.client.create_bucket(Bucket=bucket)
    return place


@pytest.fixture
def fault_proxy(s3_server):
    """A fault-injecting proxy in front of the test S3 server (``tests/scripts/fault_proxy.py``),
    for this test only: give s3fs its ``url`` as ``endpoint_url``; ``add`` faults; count ``gets``."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
    from fault_proxy import FaultProxy

    proxy = FaultProxy(s3_server[0])
    try:
        yield proxy
    finally:
        proxy.close()
