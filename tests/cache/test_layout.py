"""Names in a cache root: cache folders, locks, temporary build folders, and finding a cache by fingerprint."""

from __future__ import annotations

import json
from pathlib import Path

from lightning_tune_data.cache.fingerprints import CACHE_FORMAT_VERSION
from lightning_tune_data.cache.layout import (
    DOWNLOAD_FOLDER,
    cache_folder,
    find_cache,
    is_orphan_lock,
    is_temporary_folder,
    lock_path,
    other_caches,
    safe_name,
    temporary_prefix,
)
from lightning_tune_data.cache.marker import COMPLETE_MARKER

FINGERPRINT = "0123456789abcdef" + "9" * 48


def complete(folder: Path, metadata: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / COMPLETE_MARKER).write_text(json.dumps({"cache_format": CACHE_FORMAT_VERSION, "metadata": metadata}))
    return folder


def test_safe_name_keeps_letters_digits_dots_and_dashes() -> None:
    assert safe_name("wiki/en: 2024") == "wiki_en_2024"
    assert safe_name("..hidden-") == "hidden"
    assert safe_name("///") == "source"
    assert safe_name("x" * 100) == "x" * 80 and len(safe_name("y" * 100, limit=10)) == 10


def test_a_cache_folder_is_the_key_and_the_first_16_fingerprint_characters(tmp_path: Path) -> None:
    assert cache_folder(tmp_path, "notes", FINGERPRINT) == tmp_path / "notes-0123456789abcdef"
    assert lock_path(tmp_path / "notes-0123456789abcdef") == tmp_path / "notes-0123456789abcdef.lock"
    assert temporary_prefix(tmp_path / "notes-1") == ".notes-1.tmp-"
    assert DOWNLOAD_FOLDER == "hf_datasets"


def test_find_cache_takes_a_complete_cache_of_the_fingerprint_whatever_its_name(tmp_path: Path) -> None:
    metadata = {"fingerprint": FINGERPRINT, "manager": "M"}
    assert find_cache(tmp_path / "missing", FINGERPRINT, metadata) is None
    (tmp_path / "unfinished-0123456789abcdef").mkdir()
    complete(tmp_path / "other-0123456789abcdef", {"fingerprint": FINGERPRINT, "manager": "N"})
    assert find_cache(tmp_path, FINGERPRINT, metadata) is None  # no marker, or another manager's
    found = complete(tmp_path / "old-name-0123456789abcdef", metadata)
    assert find_cache(tmp_path, FINGERPRINT, metadata) == found


def test_other_caches_lists_the_complete_caches_of_a_key(tmp_path: Path) -> None:
    complete(tmp_path / "notes-aaaa", {})
    complete(tmp_path / "notes-bbbb", {})
    (tmp_path / "notes-cccc").mkdir()  # unfinished
    complete(tmp_path / "wiki-dddd", {})
    assert other_caches(tmp_path, "notes") == ["notes-aaaa", "notes-bbbb"]


def test_temporary_folders_and_orphan_locks_are_recognised(tmp_path: Path) -> None:
    temporary = tmp_path / ".notes-1.tmp-123-abc"
    temporary.mkdir()
    assert is_temporary_folder(temporary) and not is_temporary_folder(tmp_path)
    (tmp_path / "notes-1").mkdir()
    (tmp_path / "notes-1.lock").write_text("")
    (tmp_path / "gone-2.lock").write_text("")
    assert not is_orphan_lock(tmp_path / "notes-1.lock")
    assert is_orphan_lock(tmp_path / "gone-2.lock")
