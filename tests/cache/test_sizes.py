"""Sizes of caches: bytes under a folder and their human-readable form."""

from __future__ import annotations

import os
from pathlib import Path

import mmap

from lightning_tune_data.cache.sizes import allocated_size, human_size, tree_size


def test_human_size_uses_decimal_units_up_to_terabytes() -> None:
    assert human_size(999) == "999 B"
    assert human_size(1000) == "1.0 KB"
    assert human_size(12_345_678) == "12.3 MB"
    assert human_size(5e12) == "5000.0 GB"  # gigabytes are the largest unit shown


def test_tree_size_counts_regular_files_and_links_themselves(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.bin").write_bytes(b"x" * 10)
    (tmp_path / "b.bin").write_bytes(b"y" * 5)
    os.symlink(tmp_path / "sub" / "a.bin", tmp_path / "link")
    assert tree_size(tmp_path) == 15 + os.lstat(tmp_path / "link").st_size
    assert tree_size(tmp_path / "missing") == 0


def test_allocated_size_counts_blocks_and_files_deleted_but_still_mapped_or_open(tmp_path: Path) -> None:
    (tmp_path / "kept.bin").write_bytes(b"k" * 10_000)
    mapped, opened = tmp_path / "mapped.bin", tmp_path / "opened.bin"
    mapped.write_bytes(b"m" * 20_000)
    opened.write_bytes(b"o" * 30_000)
    with open(mapped, "rb") as handle:
        mapping = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
    held = open(opened, "rb")  # noqa: SIM115 - held open on purpose
    blocks = {p.name: os.stat(p).st_blocks * 512 for p in tmp_path.iterdir()}
    mapped.unlink()
    opened.unlink()
    try:
        assert tree_size(tmp_path) == 10_000  # what a listing sees
        assert allocated_size(tmp_path) == (sum(blocks.values()), 3)  # what the disk holds
    finally:
        mapping.close()
        held.close()
    assert allocated_size(tmp_path) == (blocks["kept.bin"], 1)
