"""A cache root: a local folder or an fsspec URL, its node-local folder, sizes, and storage errors
worded as one line naming the URL."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_tune_data.cache.root import StorageError, StoreRoot, default_local_cache_dir, parse_size


@pytest.mark.parametrize(("text", "expected"), [(1024, 1024), ("256MB", 256 * 10**6), ("256 MiB", 256 << 20),
                                                 ("1.5GB", 1_500_000_000), ("64kib", 64 << 10), ("10", 10)])
def test_sizes_are_read_with_decimal_and_binary_units(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["big", "0", "-5MB", "12 parsecs"])
def test_a_size_that_is_not_positive_or_not_a_size_says_how_to_write_one(text: str) -> None:
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def test_a_local_root_is_its_own_node_local_folder_and_file_urls_are_local(tmp_path: Path) -> None:
    root = StoreRoot(str(tmp_path))
    assert not root.is_remote and root.local_dir == tmp_path and root.local_path() == tmp_path
    assert StoreRoot(f"file://{tmp_path}").local_path() == tmp_path
    assert root.join("store", "a.arrow") == f"{tmp_path}/store/a.arrow"


def test_a_remote_root_keeps_node_copies_in_the_user_cache_unless_told_otherwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LIGHTNING_TUNE_DATA_CACHE", str(tmp_path / "node"))
    root = StoreRoot("s3://bucket/prefix/")
    assert root.is_remote and root.url == "s3://bucket/prefix"
    assert root.local_dir == default_local_cache_dir() == tmp_path / "node"
    assert root.join("store", "_COMPLETE.json") == "bucket/prefix/store/_COMPLETE.json"
    assert root.url_of(root.join("store")) == "s3://bucket/prefix/store"
    assert StoreRoot("s3://b/p", local_dir=tmp_path / "mine").local_dir == tmp_path / "mine"


def test_a_source_cache_dir_moves_the_root_but_keeps_its_options() -> None:
    root = StoreRoot("s3://bucket/a", {"endpoint_url": "http://127.0.0.1:1"}, Path("/node"), 1000)
    moved = root.with_url("s3://bucket/b")
    assert (moved.url, moved.storage_options, moved.local_dir, moved.shard_bytes) == (
        "s3://bucket/b", {"endpoint_url": "http://127.0.0.1:1"}, Path("/node"), 1000)
    assert root.with_url(None) is root
    local = root.with_url("/data/stores")
    assert local.local_dir == Path("/data/stores") and local.shard_bytes == 1000
    assert StoreRoot.of(root) is root and StoreRoot.of("/x").url == "/x"


def test_a_filesystem_that_is_not_installed_names_the_extra_to_install() -> None:
    with pytest.raises(StorageError, match=r"cache_dir gs://bucket/x: no filesystem for 'gs://' is installed .*"
                                           r"pip install 'lightning-tune-data\[s3\]'.*'\[gcs\]'"):
        StoreRoot("gs://bucket/x").filesystem()


def test_a_failing_storage_call_becomes_one_line_naming_the_url_and_the_fix() -> None:
    root = StoreRoot("s3://bucket/x")

    def refuse() -> None:
        raise ConnectionError("Could not connect to the endpoint URL\nwith a long trace")

    with pytest.raises(StorageError) as info:
        root.call("s3://bucket/x/store/_COMPLETE.json", refuse)
    message = str(info.value)
    assert "\n" not in message and "s3://bucket/x/store/_COMPLETE.json" in message
    assert "ConnectionError: Could not connect to the endpoint URL" in message and "endpoint_url" in message

    def no_credentials() -> None:
        raise RuntimeError("Unable to locate credentials")

    with pytest.raises(StorageError, match=r"set credentials"):
        root.call("s3://bucket/x", no_credentials)
    with pytest.raises(FileNotFoundError):
        root.call("s3://bucket/x", lambda: (_ for _ in ()).throw(FileNotFoundError("gone")))


def test_check_names_a_missing_bucket_and_probes_a_writable_root(s3) -> None:
    from lightning_tune_data.cache.root import StorageError, StoreRoot

    StoreRoot(s3.url, s3.storage_options).check(writable=True)
    assert not s3.keys()  # the probe is removed again
    missing = StoreRoot(f"s3://{s3.bucket}-gone/x", s3.storage_options)
    for writable in (False, True):
        with pytest.raises(StorageError, match=rf"the bucket \(or container\) '{s3.bucket}-gone' does not exist"):
            missing.check(writable=writable)
    StoreRoot("/tmp/not-checked-here").check(writable=True)  # a local root is checked when it is written
