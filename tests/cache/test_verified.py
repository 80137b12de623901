"""Checksums are verified when files are written or downloaded; later checks hash only the files
whose stamp (size, modification time, inode) changed since, and a full check hashes everything."""

from __future__ import annotations

from pathlib import Path

from conftest import flip_keeping_stamp

from lightning_tune_data.cache.checksums import tree_checksums, verify_files
from lightning_tune_data.cache.verified import VERIFIED_RECORD, file_stamp, read_verified, record_verified


def test_verified_stamps_are_recorded_and_read_back(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(b"abc")
    assert read_verified(tmp_path) == {} and file_stamp(tmp_path / "missing") is None
    record_verified(tmp_path, ["a.bin", "missing.bin"])
    assert read_verified(tmp_path) == {"a.bin": file_stamp(tmp_path / "a.bin")}
    assert sorted(p.name for p in tmp_path.iterdir()) == [VERIFIED_RECORD, "a.bin"]


def test_a_rewritten_file_is_hashed_again_and_its_corruption_named(tmp_path: Path) -> None:
    (tmp_path / "shard.arrow").write_bytes(b"x" * 4096)
    recorded = tree_checksums(tmp_path)
    assert verify_files(tmp_path, recorded, "checksum") is None  # first check hashes and records
    assert "shard.arrow" in read_verified(tmp_path)
    data = bytearray((tmp_path / "shard.arrow").read_bytes())
    data[100] ^= 0x01
    (tmp_path / "shard.arrow").write_bytes(bytes(data))  # same size, new modification time
    problem = verify_files(tmp_path, recorded, "checksum")
    assert problem is not None and "shard.arrow does not match the checksum recorded when it was written" in problem


def test_an_unchanged_stamp_skips_the_hash_and_a_full_check_still_finds_the_flip(tmp_path: Path) -> None:
    (tmp_path / "shard.arrow").write_bytes(b"y" * 4096)
    recorded = tree_checksums(tmp_path)
    assert verify_files(tmp_path, recorded, "checksum") is None
    flip_keeping_stamp(tmp_path / "shard.arrow")  # a corruption that kept size and modification time
    assert verify_files(tmp_path, recorded, "checksum") is None  # the stamp check cannot see it
    assert "does not match the checksum" in verify_files(tmp_path, recorded, "full")
