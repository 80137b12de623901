"""One source's cache: found by fingerprint under any name, built once, opened with clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest

from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.cache.tasks import write_task
from lightning_tune_data.managers import CacheMissingError
from lightning_tune_data.managers.source_cache import SourceCache

FINGERPRINT = "0123456789abcdef" + "0" * 48


def fill(folder: Path, fingerprint: str = FINGERPRINT) -> None:
    """Write a one-task store of two rows, as prepare_data's build does."""
    table = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3]]}).data.table
    write_task(folder, table, fingerprint, 0, 1, {"part": "all"}, 2, 0, 1 << 20)


def cache(root: Path, key: str = "notes", fingerprint: str = FINGERPRINT) -> SourceCache:
    return SourceCache(root, key, fingerprint, "LocalDatasetManager", "source 'notes'")


def test_a_new_cache_is_named_after_the_key_and_found_by_fingerprint_after_a_rename(tmp_path: Path) -> None:
    first = cache(tmp_path)
    assert first.folder() == tmp_path / "notes-0123456789abcdef"
    assert first.metadata == {"fingerprint": FINGERPRINT, "manager": "LocalDatasetManager"}
    built = first.build(fill, {"source_key": "notes"}, "checksum")
    assert built == tmp_path / "notes-0123456789abcdef"
    renamed = cache(tmp_path, key="renamed")
    assert renamed.folder() == built  # same fingerprint: the existing cache, not a second build
    assert renamed.open()["input_ids"] == [[1, 2], [3]]


def test_opening_a_missing_cache_says_to_run_prepare_data_and_lists_other_configurations(tmp_path: Path) -> None:
    with pytest.raises(CacheMissingError, match=r"source 'notes': no valid preprocessed cache at .*Run prepare_data "
                                                r"first") as info:
        cache(tmp_path).open()
    assert "Caches of other configurations" not in str(info.value)
    cache(tmp_path, fingerprint="f" * 64).build(lambda folder: fill(folder, "f" * 64), {"source_key": "notes"}, "size")
    with pytest.raises(CacheMissingError, match=r"Caches of other configurations of this source exist "
                                                r"\(\['notes-ffffffffffffffff'\]\)"):
        cache(tmp_path).open()


def test_opening_a_cache_whose_commit_disagrees_with_its_shards_says_it_is_corrupt(tmp_path: Path) -> None:
    built = cache(tmp_path).build(fill, {"source_key": "notes"}, "checksum")
    commit = json.loads((built / "_COMPLETE.json").read_text())
    commit["store"]["rows"] = 5
    (built / "_COMPLETE.json").write_text(json.dumps(commit))
    with pytest.raises(CacheMissingError, match=r"is corrupt \(it holds 2 rows, 5 were written\)\. Run prepare_data "
                                                r"again"):
        cache(tmp_path).open()


def test_opening_a_cache_with_a_truncated_shard_names_the_shard(tmp_path: Path) -> None:
    built = cache(tmp_path).build(fill, {"source_key": "notes"}, "checksum")
    shard = built / "shards" / "task-00000-of-00001" / "00000.arrow"
    shard.write_bytes(shard.read_bytes()[:-8])
    with pytest.raises(CacheMissingError, match=r"shard shards/task-00000-of-00001/00000\.arrow has \d+ bytes, \d+ "
                                                r"were written \(truncated or overwritten\)"):
        cache(tmp_path).open()


def test_build_stores_never_fails_naming_the_store_and_prepare_and_builds_nothing(tmp_path: Path) -> None:
    never = SourceCache(StoreRoot(str(tmp_path), build_stores="never"), "notes", FINGERPRINT, "LocalDatasetManager",
                        "source 'notes'")
    with pytest.raises(CacheMissingError) as missing:
        never.build(fill, {"source_key": "notes"}, "checksum")
    assert str(missing.value) == (
        f"source 'notes': no committed store at {tmp_path / 'notes-0123456789abcdef'}, and build_stores=never does not "
        f"build it here. Run lightning-tune-data prepare --config <config> with this cache_dir first (or set "
        f"build_stores: if_missing to tokenize on this node); if the store should exist, check cache_dir.")
    assert not list(tmp_path.iterdir())
    built = cache(tmp_path).build(fill, {"source_key": "notes"}, "checksum")  # auto on a local root: built
    assert never.build(fill, {"source_key": "notes"}, "checksum") == built  # a committed store is used as it is


def test_build_stores_takes_only_its_values() -> None:
    with pytest.raises(ValueError, match=r"build_stores='sometimes' is not one of auto, never, if_missing"):
        StoreRoot("/tmp/x", build_stores="sometimes")  # type: ignore[arg-type]
    assert StoreRoot("s3://b/p").builds_missing_stores is False and StoreRoot("/tmp/x").builds_missing_stores
    assert StoreRoot("s3://b/p", build_stores="if_missing").with_url("s3://c/q").builds_missing_stores
