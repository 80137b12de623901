"""A local stand-in for the Hugging Face hub: the few endpoints ``huggingface_hub`` and
``datasets.load_dataset`` call for a dataset of one JSONL file, at two commits.

The default branch ``main`` points to commit ``A`` until the file named by ``moved`` exists, then
to commit ``B`` (the hub moved between two tasks). Every request's path is recorded.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = "owner/corpus"
COMMITS = {"a" * 40: [f"first commit, row {i}" for i in range(6)],
           "b" * 40: [f"second commit, row {i}" for i in range(9)]}


def _data(commit: str) -> bytes:
    return "".join(json.dumps({"text": text}) + "\n" for text in COMMITS[commit]).encode()


class HubStandIn:
    """Serves :data:`REPO` on 127.0.0.1 until :meth:`close`.

    Args:
        moved: ``main`` points to the second commit once this file exists.
    """

    def __init__(self, moved: Path) -> None:
        self.moved = moved
        self.paths: list[str] = []
        stand_in = self

        class Handler(BaseHTTPRequestHandler):
            def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
                self.do_GET()

            def do_GET(self) -> None:  # noqa: N802
                path = self.path.split("?")[0]
                stand_in.paths.append(path)
                status, body, headers = stand_in.answer(path)
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def main(self) -> str:
        """The commit ``main`` points to now."""
        return "b" * 40 if self.moved.exists() else "a" * 40

    def answer(self, path: str) -> tuple[int, bytes, dict[str, str]]:
        info = f"/api/datasets/{REPO}"
        if path.startswith(info):
            rest = path[len(info):].strip("/").split("/")
            commit = rest[1] if len(rest) > 1 and rest[0] in ("revision", "tree", "paths-info") else "main"
            commit = self.main() if commit == "main" else commit
            if commit not in COMMITS:
                return 404, b'{"error": "Revision not found"}', {"X-Error-Code": "RevisionNotFound"}
            entry = {"type": "file", "oid": commit[:8], "size": len(_data(commit)), "path": "train.jsonl"}
            if rest[0] in ("tree", "paths-info") and (len(rest) == 2):
                return 200, json.dumps([entry]).encode(), {"Content-Type": "application/json"}
            if rest[0] in ("tree", "paths-info"):
                return 200, b"[]", {"Content-Type": "application/json"}
            return 200, json.dumps({"id": REPO, "sha": commit, "siblings": [{"rfilename": "train.jsonl"}],
                                    "private": False, "tags": []}).encode(), {"Content-Type": "application/json"}
        prefix = f"/datasets/{REPO}/resolve/"
        if path.startswith(prefix) and path.endswith("/train.jsonl"):
            commit = path[len(prefix):].split("/")[0]
            commit = self.main() if commit == "main" else commit
            if commit in COMMITS:
                return 200, _data(commit), {"X-Repo-Commit": commit, "ETag": f'"{commit[:8]}"'}
        return 404, b"{}", {"X-Error-Code": "EntryNotFound"}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
