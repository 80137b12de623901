"""Two nodes on one shared cache directory: one build, every rank memory-maps the same cache."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_texts, write_jsonl

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "node_fit.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_two_nodes(tmp_path: Path, prepare_data_per_node: bool) -> list[dict]:
    write_jsonl(tmp_path / "a.jsonl", make_texts(40, seed=1, prefix="A"))
    port = str(free_port())
    processes = []
    for node in (0, 1):
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "NODE_RANK": str(node),
               "LOCAL_RANK": "0", "WORLD_SIZE": "2"}
        args = [sys.executable, str(SCRIPT), str(tmp_path), str(tmp_path / "shared_cache"),
                str(tmp_path / f"node{node}.json"), "1" if prepare_data_per_node else "0"]
        processes.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for process in processes:
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-4000:]
    return [json.loads((tmp_path / f"node{node}.json").read_text()) for node in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("prepare_data_per_node", [False, True])
def test_two_nodes_on_a_shared_cache_dir_tokenize_once_and_read_the_same_cache(tmp_path, prepare_data_per_node):
    nodes = run_two_nodes(tmp_path, prepare_data_per_node)
    assert [n["node_rank"] for n in nodes] == [0, 1] and all(n["steps"] == 2 for n in nodes)
    builds = [line for n in nodes for line in n["log"] if "built cache" in line]
    assert len(builds) == 1, [n["log"] for n in nodes]
    assert nodes[0]["cache_files"] == nodes[1]["cache_files"]
    assert all(str(tmp_path / "shared_cache") in f for f in nodes[0]["cache_files"])
    if not prepare_data_per_node:
        assert not any("a" in line for line in nodes[1]["log"]), "node 1 must not run prepare_data"
