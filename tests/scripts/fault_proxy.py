"""A fault-injecting HTTP proxy in front of the test S3 server, and small stores written behind it.

s3fs reaches the S3 server through :class:`FaultProxy` (its ``endpoint_url``). Every request is
forwarded; a :class:`Fault` whose ``path_part`` (and optionally range start) matches a ``GET``
changes what the client gets for the first ``times`` matching GETs: the connection closed half-way
through the body (``drop``), an S3 error status instead of the object (``status``), a shorter body
with a matching ``Content-Length`` (``truncate``), one byte flipped (``corrupt``) or the body sent
slowly in pieces (``slow``). The proxy counts every GET by path and range, so a test can tell how
many downloads and retries really happened.
"""

from __future__ import annotations

import http.client
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import xxhash

_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


@dataclass
class Fault:
    """What to do to the first ``times`` GETs whose path contains ``path_part`` (``None``: every one).

    Args:
        path_part: part of the object path (``/<bucket>/<key>``) the fault applies to.
        action: ``drop``, ``status``, ``truncate``, ``corrupt`` or ``slow``.
        times: how many matching GETs it changes; ``None`` for all.
        status: the HTTP status of a ``status`` fault.
        range_start: only GETs of a byte range starting there (``None``: any).
        piece, delay_s: a ``slow`` body is sent ``piece`` bytes at a time, ``delay_s`` apart.
    """

    path_part: str
    action: str
    times: int | None = 1
    status: int = 503
    range_start: int | None = None
    piece: int = 16 << 10
    delay_s: float = 0.02
    applied: int = 0


def _range_start(header: str | None) -> int | None:
    if not header or not header.startswith("bytes="):
        return None
    start = header[len("bytes="):].split("-", 1)[0]
    return int(start) if start.isdigit() else None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args: Any) -> None:  # one line per request otherwise
        pass

    def _forward(self) -> None:
        proxy = self.server.proxy
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        path = unquote(urlsplit(self.path).path)
        fault = proxy._seen(self.command, path, _range_start(self.headers.get("Range")))
        if fault is not None and fault.action == "status":
            error = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ServiceUnavailable</Code>'
                     f"<Message>injected {fault.status}</Message><RequestId>fault</RequestId></Error>").encode()
            self.send_response(fault.status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(error)))
            self.end_headers()
            self.wfile.write(error)
            return
        upstream = http.client.HTTPConnection(proxy.upstream_host, proxy.upstream_port, timeout=60)
        try:
            upstream.request(self.command, self.path, body=body,
                             headers={k: v for k, v in self.headers.items() if k.lower() not in _HOP})
            response = upstream.getresponse()
            data = response.read()
            headers = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP | {"content-length"}]
            head_length = response.getheader("Content-Length", "0")
        finally:
            upstream.close()
        sent_length = len(data)
        if fault is not None and fault.action == "truncate":
            data = data[: len(data) // 2]
            sent_length = len(data)
        elif fault is not None and fault.action == "corrupt" and data:
            flipped = bytearray(data)
            flipped[len(flipped) // 2] ^= 0xFF
            data = bytes(flipped)
        self.send_response(response.status, response.reason)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", head_length if self.command == "HEAD" else str(sent_length))
        self.end_headers()
        if self.command == "HEAD":
            return
        if fault is not None and fault.action == "drop":
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault is not None and fault.action == "slow":
            for offset in range(0, len(data), fault.piece):
                self.wfile.write(data[offset: offset + fault.piece])
                self.wfile.flush()
                time.sleep(fault.delay_s)
            return
        self.wfile.write(data)

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _forward


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    proxy: FaultProxy


class FaultProxy:
    """A proxy on 127.0.0.1 (a free port) in front of ``upstream`` (``http://host:port``)."""

    def __init__(self, upstream: str) -> None:
        netloc = urlsplit(upstream).netloc
        self.upstream_host, port = netloc.rsplit(":", 1)
        self.upstream_port = int(port)
        self.faults: list[Fault] = []
        self.requests: list[tuple[str, str, int | None]] = []
        self._lock = threading.Lock()
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.proxy = self
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), name="fault-proxy", daemon=True)
        self._thread.start()

    def add(self, *faults: Fault) -> None:
        with self._lock:
            self.faults.extend(faults)

    def _seen(self, method: str, path: str, start: int | None) -> Fault | None:
        with self._lock:
            self.requests.append((method, path, start))
            if method != "GET":
                return None
            for fault in self.faults:
                if fault.path_part in path and fault.range_start in (None, start) and (
                        fault.times is None or fault.applied < fault.times):
                    fault.applied += 1
                    return fault
            return None

    def gets(self, path_part: str, range_start: int | None = None) -> int:
        """GETs so far of paths containing ``path_part`` (of a range starting at ``range_start``)."""
        with self._lock:
            return sum(1 for method, path, start in self.requests
                       if method == "GET" and path_part in path and range_start in (None, start))

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def storage_options(endpoint: str) -> dict[str, Any]:
    """s3fs options reaching ``endpoint`` with botocore's own retries off (one attempt per request)
    and its response checksums checked only where required (a whole-object GET of an object
    uploaded with a checksum is otherwise checked by botocore, which would catch a damaged body
    before the package's own size/checksum check does)."""
    return {"endpoint_url": endpoint, "key": "testing", "secret": "testing",
            "config_kwargs": {"retries": {"total_max_attempts": 1}, "response_checksum_validation": "when_required"}}


def without_library_retries(files: Any) -> Any:
    """``files`` (a ``StoreFiles``) with s3fs's own retries of a dropped body off: every retry a
    test counts is then the package's."""
    files.fs.retries = 1
    return files


def shard_entry(path: str, data: bytes, rows: int = 1) -> dict[str, Any]:
    """A commit's entry for a shard of bytes ``data`` (``path``, rows, tokens, size, checksum)."""
    return {"path": path, "rows": rows, "tokens": rows, "size": len(data), "xxh3_128": xxhash.xxh3_128(data).hexdigest()}


def put_random_shards(s3: Any, store: str, sizes: list[int]) -> tuple[list[dict[str, Any]], list[bytes]]:
    """Random shards of ``sizes`` bytes in store folder ``store`` of the test's bucket: their entries and bytes."""
    entries, blobs = [], []
    for number, size in enumerate(sizes):
        data = secrets.token_bytes(size)
        path = f"shards/task-00000-of-00001/{number:05d}.arrow"
        s3.put(f"{store}/{path}", data)
        entries.append(shard_entry(path, data))
        blobs.append(data)
    return entries, blobs


def partials(folder: Path) -> list[Path]:
    """The partial downloads left under a node cache folder."""
    return sorted(path for path in Path(folder).rglob("*") if ".partial-" in path.name)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
