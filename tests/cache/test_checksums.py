"""Content hashes: data-file identities (remembered in the cache root) and per-file checksums of caches."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lightning_tune_data.cache import checksums
from lightning_tune_data.cache.checksums import (
    CHECKSUM_ALGORITHM,
    FILE_HASH_MEMO,
    file_checksum,
    file_identity,
    tree_checksums,
    verify_files,
)


def test_file_identity_of_missing_file_raises_naming_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        file_identity(tmp_path / "nope.jsonl")


def test_file_identity_follows_the_content_of_every_byte_not_the_mtime(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    payload = bytearray(os.urandom(3 * (1 << 20)))
    path.write_bytes(bytes(payload))
    before = file_identity(path)
    assert before["path"] == str(path.resolve()) and before["size"] == len(payload)
    os.utime(path, ns=(1, 10**18))  # a touch: new mtime, same bytes
    assert file_identity(path) == before
    stat = path.stat()
    payload[len(payload) // 2] ^= 0x01  # one bit in the middle, same size, mtime restored
    path.write_bytes(bytes(payload))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = file_identity(path)
    assert after["size"] == before["size"] and after != before


def test_file_identity_remembers_hashes_by_size_mtime_and_inode_in_the_cache_root(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "a"}\n')
    memo_dir = tmp_path / "cache"
    file_identity(path, memo_dir=memo_dir)
    assert not memo_dir.exists()  # the memo never creates the cache root
    memo_dir.mkdir()
    first = file_identity(path, memo_dir=memo_dir)
    memo_file = memo_dir / FILE_HASH_MEMO
    memo = json.loads(memo_file.read_text())
    assert memo[str(path.resolve())]["xxh3_128"] == first["xxh3_128"]
    # An entry whose stamp matches is trusted without reading the file again ...
    memo[str(path.resolve())]["xxh3_128"] = "remembered"
    memo_file.write_text(json.dumps(memo))
    checksums._memo.clear()
    assert file_identity(path, memo_dir=memo_dir)["xxh3_128"] == "remembered"
    # ... and a touch (new mtime) re-hashes the file, finding the real, unchanged content.
    os.utime(path, ns=(1, 10**18))
    assert file_identity(path, memo_dir=memo_dir) == first


def test_file_checksum_is_the_xxh3_128_of_the_bytes(tmp_path: Path) -> None:
    path = tmp_path / "blob.bin"
    path.write_bytes(b"abc")
    assert CHECKSUM_ALGORITHM == "xxh3_128"
    assert file_checksum(path) == "06b05ab6733a618578af5f94892f3950"
    (tmp_path / "empty.bin").write_bytes(b"")
    assert file_checksum(tmp_path / "empty.bin") == "99aa06d3014798d86001c324468d497f"


def test_tree_checksums_records_every_regular_file_by_relative_posix_path(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.bin").write_bytes(b"aa")
    (tmp_path / "marker.json").write_text("{}")
    os.symlink(tmp_path / "sub" / "a.bin", tmp_path / "link.bin")
    recorded = tree_checksums(tmp_path, exclude=["marker.json"])
    assert list(recorded) == ["sub/a.bin"]  # the excluded file and the symlink are left out
    assert recorded["sub/a.bin"] == {"size": 2, CHECKSUM_ALGORITHM: file_checksum(tmp_path / "sub" / "a.bin")}


def test_verify_files_names_the_first_missing_truncated_or_changed_file(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"0123456789")
    recorded = tree_checksums(tmp_path)
    assert verify_files(tmp_path, recorded) is None
    (tmp_path / "a.bin").write_bytes(b"0123456788")  # same size, other bytes
    assert verify_files(tmp_path, recorded, "size") is None
    assert "does not match the checksum recorded" in verify_files(tmp_path, recorded, "checksum")
    (tmp_path / "a.bin").write_bytes(b"01")
    assert "has 2 bytes, 10 were written" in verify_files(tmp_path, recorded, "size")
    (tmp_path / "a.bin").unlink()
    assert verify_files(tmp_path, recorded, "size") == f"file {tmp_path / 'a.bin'} is missing"
    with pytest.raises(ValueError, match=r"'fast' is not one of"):
        verify_files(tmp_path, recorded, "fast")


def test_the_hash_memo_is_kept_only_in_an_existing_cache_root(tmp_path: Path) -> None:
    path = tmp_path / "data.txt"
    path.write_text("x")
    file_identity(path, memo_dir=tmp_path / "missing-root")
    assert not (tmp_path / "missing-root").exists()
    file_identity(path, memo_dir=tmp_path)
    assert json.loads((tmp_path / FILE_HASH_MEMO).read_text())[str(path.resolve())]["stamp"][0] == 1
    checksums._memo.clear()
