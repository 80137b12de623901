"""A store folder's files on a local root: written whole (never half a file under the final name),
read back, listed, sized, copied in and out, removed. The same calls on object storage are
exercised against an S3 server in the remote-store suite."""

from __future__ import annotations

from pathlib import Path

from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.cache.store_files import StoreFiles, store_folders


def test_files_are_written_whole_and_read_back(tmp_path: Path) -> None:
    files = StoreFiles(StoreRoot(str(tmp_path)), "notes-0123")
    assert files.read_json("tasks/a.json") is None and files.size("tasks/a.json") is None
    written = files.write_json("tasks/a.json", {"b": 1, "a": [Path("/x")]})
    assert written == b'{\n  "a": [\n    "/x"\n  ],\n  "b": 1\n}'
    assert files.read_json("tasks/a.json") == {"a": ["/x"], "b": 1}
    assert files.read_bytes("tasks/a.json") == written and files.size("tasks/a.json") == len(written)
    assert files.exists("tasks/a.json") and not files.exists("tasks/b.json")
    assert sorted(p.name for p in (tmp_path / "notes-0123" / "tasks").iterdir()) == ["a.json"]  # no temporaries
    assert files.url("tasks/a.json") == str(tmp_path / "notes-0123" / "tasks" / "a.json")


def test_not_json_reads_as_missing(tmp_path: Path) -> None:
    files = StoreFiles(StoreRoot(str(tmp_path)), "s")
    files.write_bytes("x.json", b"{half")
    assert files.read_json("x.json") is None


def test_files_are_copied_in_and_out_listed_and_the_folder_removed(tmp_path: Path) -> None:
    files = StoreFiles(StoreRoot(str(tmp_path / "root")), "s")
    source = tmp_path / "shard.arrow"
    source.write_bytes(b"0123456789")
    files.put(source, "shards/t/00000.arrow")
    files.put(source, "shards/t/00001.arrow")
    assert files.listing("shards/t") == ["00000.arrow", "00001.arrow"] and files.listing("nothing") == []
    files.get("shards/t/00001.arrow", tmp_path / "back.arrow")
    assert (tmp_path / "back.arrow").read_bytes() == b"0123456789"
    files.remove()
    assert not (tmp_path / "root" / "s").exists()
    files.remove()  # removing what is gone is fine


def test_store_folders_lists_the_folders_of_a_root_matching_a_pattern(tmp_path: Path) -> None:
    root = StoreRoot(str(tmp_path / "root"))
    assert store_folders(root) == []  # a root that does not exist yet holds nothing
    for name in ("notes-aaaa", "notes-bbbb", "other-cccc"):
        StoreFiles(root, name).write_bytes("x", b"1")
    (tmp_path / "root" / "notes-file").write_bytes(b"not a folder")
    assert store_folders(root) == ["notes-aaaa", "notes-bbbb", "other-cccc"]
    assert store_folders(root, "notes-*") == ["notes-aaaa", "notes-bbbb"]
