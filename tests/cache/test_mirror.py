"""Whole-store copies between a root and this node: downloads verified file by file and renamed
into place, a corrupt file fetched twice then named, uploads with the commit last, tasks published
shards first and done-marker last. (The root here is another local folder; the same code runs
against an S3 server in the remote-store suite.)"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from lightning_tune_data.cache.marker import COMPLETE_MARKER, read_cache_metadata
from lightning_tune_data.cache.mirror import StoreCorruptError, download_store, publish_task, upload_store
from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.cache.store_files import StoreFiles
from lightning_tune_data.cache.store_reader import open_store
from lightning_tune_data.cache.tasks import TaskManifest, commit_store, finished_task, write_task

FINGERPRINT = "d" * 64
METADATA = {"fingerprint": FINGERPRINT, "manager": "LocalDatasetManager"}


def staged_task(staging: Path, index: int, count: int, rows: list[list[int]]) -> TaskManifest:
    table = pa.table({"input_ids": pa.array(rows, type=pa.list_(pa.int32()))})
    return write_task(staging, table, FINGERPRINT, index, count, {}, len(rows), 0, 1 << 20)


@pytest.fixture
def committed(tmp_path: Path) -> tuple[StoreFiles, dict]:
    files = StoreFiles(StoreRoot(str(tmp_path / "remote")), "notes-dddd")
    for index, rows in enumerate([[[1, 2], [3]], [[4, 5, 6]]]):
        staging = tmp_path / f"staging-{index}"
        staging.mkdir()
        publish_task(staging, files, staged_task(staging, index, 2, rows))
        assert finished_task(files, index, 2, FINGERPRINT) is not None
    return files, commit_store(files, 2, FINGERPRINT, METADATA, {}, "source 'notes'")


def test_a_committed_store_is_downloaded_verified_and_reused(tmp_path: Path, committed: tuple) -> None:
    files, content = committed
    local = download_store(files, content, tmp_path / "node" / "notes-dddd", "source 'notes'")
    dataset, problem = open_store(local)
    assert problem is None and dataset["input_ids"] == [[1, 2], [3], [4, 5, 6]]
    assert read_cache_metadata(local) == content
    assert sorted(p.name for p in (tmp_path / "node").iterdir()) == ["notes-dddd", "notes-dddd.lock"]
    stamp = (local / content["store"]["shards"][0]["path"]).stat().st_mtime_ns
    download_store(files, content, local, "source 'notes'")
    assert (local / content["store"]["shards"][0]["path"]).stat().st_mtime_ns == stamp  # not fetched again


def test_a_corrupt_file_in_storage_is_named_and_nothing_is_left_to_trust(tmp_path: Path, committed: tuple) -> None:
    files, content = committed
    shard = Path(files.path("shards/task-00001-of-00002/00000.arrow"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x40
    shard.write_bytes(bytes(data))
    node = tmp_path / "node"
    with pytest.raises(StoreCorruptError, match=r"shards/task-00001-of-00002/00000\.arrow is corrupt \(xxh3_128 .* "
                                                r"recorded when it was written\)"):
        download_store(files, content, node / "notes-dddd", "source 'notes'")
    assert not (node / "notes-dddd").exists() and not [p for p in node.iterdir() if p.name.startswith(".")]


def test_an_upload_puts_every_file_then_the_commit(tmp_path: Path, committed: tuple) -> None:
    files, content = committed
    local = download_store(files, content, tmp_path / "node" / "notes-dddd", "source 'notes'")
    target = StoreFiles(StoreRoot(str(tmp_path / "other")), "notes-dddd")
    upload_store(local, target, "source 'notes'")
    assert target.read_bytes(COMPLETE_MARKER) == files.read_bytes(COMPLETE_MARKER)
    for relative in content["files"]:
        assert target.read_bytes(relative) == files.read_bytes(relative)


def test_a_corrupt_local_copy_is_downloaded_again_with_a_warning(tmp_path: Path, committed: tuple) -> None:
    files, content = committed
    local = download_store(files, content, tmp_path / "node" / "notes-dddd", "source 'notes'")
    shard = local / content["store"]["shards"][1]["path"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match=r"Removing the corrupt local copy .*notes-dddd \(file .*00000\.arrow does "
                                         r"not match the checksum"):
        download_store(files, content, local, "source 'notes'")
    dataset, problem = open_store(local)
    assert problem is None and dataset["input_ids"] == [[1, 2], [3], [4, 5, 6]]


def test_an_upload_replaces_a_file_of_the_right_size_whose_bytes_differ(tmp_path: Path, committed: tuple) -> None:
    files, content = committed
    local = download_store(files, content, tmp_path / "node" / "notes-dddd", "source 'notes'")
    target = StoreFiles(StoreRoot(str(tmp_path / "other")), "notes-dddd")
    relative = content["store"]["shards"][0]["path"]
    damaged = bytearray((local / relative).read_bytes())
    damaged[len(damaged) // 2] ^= 0x01  # a killed earlier upload left other bytes of the same size
    (Path(target.path(relative))).parent.mkdir(parents=True)
    Path(target.path(relative)).write_bytes(bytes(damaged))
    upload_store(local, target, "source 'notes'")
    assert target.read_bytes(relative) == files.read_bytes(relative)


def test_a_store_prepared_again_during_a_download_is_refused_even_with_the_same_metadata(
        tmp_path: Path, committed: tuple) -> None:
    files, content = committed
    relative = content["store"]["shards"][0]["path"]
    first = Path(files.path(relative)).read_bytes()
    stale = {**content, "store": {**content["store"], "rows": -1}}  # the commit read first, of an earlier preparation
    with pytest.raises(StoreCorruptError, match="changed during the download"):
        download_store(files, stale, tmp_path / "node" / "notes-dddd", "source 'notes'")
    assert not (tmp_path / "node" / "notes-dddd").exists() and Path(files.path(relative)).read_bytes() == first
