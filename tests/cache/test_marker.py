"""The completion marker: what makes a folder a finished cache, and what it records."""

from __future__ import annotations

import json
from pathlib import Path

import lightning_tune_data
from lightning_tune_data.cache.fingerprints import CACHE_FORMAT_VERSION
from lightning_tune_data.cache.marker import COMPLETE_MARKER, is_valid_cache, read_cache_metadata
from lightning_tune_data.cache.store import build_cache_atomically


def _write_file_build(content: str, calls: list[str]):
    def build(temp_dir: Path) -> None:
        calls.append(str(temp_dir))
        (temp_dir / "data.txt").write_text(content)

    return build


def test_corrupt_or_foreign_format_marker_is_invalid(tmp_path: Path) -> None:
    final = tmp_path / "src"
    final.mkdir()
    (final / COMPLETE_MARKER).write_text("{not json")
    assert not is_valid_cache(final)
    (final / COMPLETE_MARKER).write_text(json.dumps({"cache_format": -1, "metadata": {}}))
    assert not is_valid_cache(final)
    assert not is_valid_cache(tmp_path / "does-not-exist")


def test_read_cache_metadata_returns_marker_of_complete_cache(tmp_path: Path) -> None:
    final = tmp_path / "src"
    build_cache_atomically(final, _write_file_build("x", []), {"fp": "7", "n": [1, 2]})
    content = read_cache_metadata(final)
    assert content["metadata"] == {"fp": "7", "n": [1, 2]}
    assert content["package_version"] == lightning_tune_data.__version__
    assert read_cache_metadata(tmp_path / "missing") is None


def test_is_valid_cache_compares_the_metadata_canonically(tmp_path: Path) -> None:
    final = tmp_path / "src"
    final.mkdir()
    marker = {"cache_format": CACHE_FORMAT_VERSION, "metadata": {"fingerprint": "f", "manager": "M"}}
    (final / COMPLETE_MARKER).write_text(json.dumps(marker))
    assert is_valid_cache(final)
    assert is_valid_cache(final, {"manager": "M", "fingerprint": "f"})  # key order does not matter
    assert not is_valid_cache(final, {"fingerprint": "g", "manager": "M"})
    (final / COMPLETE_MARKER).write_text(json.dumps(["not", "a", "mapping"]))
    assert read_cache_metadata(final) is None and not is_valid_cache(final)
