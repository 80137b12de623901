"""``cache verify`` re-hashes every committed store and names a corrupt file, even one whose
modification time was kept (what opening a store cannot see)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import make_texts, write_jsonl
from test_cache import REPO_ROOT, prepare


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "lightning_tune_data", "cache", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def flip_keeping_stamp(path: Path) -> None:
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_verify_rehashes_every_store_and_names_a_corrupt_shard(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    prepare(write_jsonl(tmp_path / "a.jsonl", make_texts(20, seed=1)), cache_dir, name="notes")
    prepare(write_jsonl(tmp_path / "b.jsonl", make_texts(20, seed=2)), cache_dir, name="other")
    result = cli("verify", "--cache-dir", str(cache_dir))
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(": ok") == 2 and "Verified 2 stores" in result.stdout and "0 corrupt" in result.stdout
    shard = next((cache_dir).glob("notes-*/shards/*/*.arrow"))
    flip_keeping_stamp(shard)
    result = cli("verify", "--cache-dir", str(cache_dir), "--source", "notes")
    assert result.returncode == 1
    assert f"CORRUPT: file {shard} does not match the checksum recorded when it was written" in result.stdout
    assert "Verified 1 stores" in result.stdout and "1 corrupt" in result.stdout
