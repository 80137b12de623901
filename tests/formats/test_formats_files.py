"""Corpus locations: local folders and globs, and fsspec URLs on the S3 stand-in (files listed with
their identity, copied once per node)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenized_writers import documents, megatron_documents, write_megatron

from lightning_tune_data import TokenizedDatasetManager
from lightning_tune_data.formats.files import LOCAL_COPIES_FOLDER, CorpusFiles


def test_a_folder_a_glob_and_a_file_list_what_they_match(tmp_path: Path) -> None:
    for name in ("a.bin", "b.bin", "sub/c.bin"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"12")
    listed = lambda path: [Path(name).name for name in CorpusFiles(path, None, tmp_path, "s").listing()]  # noqa: E731
    assert listed(str(tmp_path)) == ["a.bin", "b.bin", "c.bin"]
    assert listed(str(tmp_path / "*.bin")) == ["a.bin", "b.bin"]
    assert listed(str(tmp_path / "b.bin")) == ["b.bin"]
    entry = CorpusFiles(str(tmp_path / "a.bin"), None, tmp_path, "s").identity(str(tmp_path / "a.bin"))
    assert entry["size"] == 2 and entry["stamp"]


def test_a_path_matching_nothing_fails_naming_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"path '.*nothing/\*\.bin' matches no file"):
        CorpusFiles(str(tmp_path / "nothing" / "*.bin"), None, tmp_path, "source 'x'").listing()


def test_a_corpus_on_s3_is_listed_with_etags_copied_once_and_read_as_written(tmp_path: Path, s3) -> None:
    write_megatron(tmp_path / "corpus" / "a", documents(20, seed=18))
    for name in ("a.bin", "a.idx"):
        s3.put(f"corpus/{name}", (tmp_path / "corpus" / name).read_bytes())
    manager = TokenizedDatasetManager(f"{s3.url}/corpus/", storage_options=s3.storage_options)
    corpus = manager.setup(None, tmp_path / "node")
    assert [item["url"] for item in corpus.identity()] == [f"{s3.url}/corpus/a.bin", f"{s3.url}/corpus/a.idx"]
    assert all(item["stamp"] for item in corpus.identity())
    expected = megatron_documents(tmp_path / "corpus" / "a")
    column = corpus.table().column("input_ids")
    assert all(np.array_equal(column[i].values.to_numpy(), expected[i]) for i in range(20))
    copies = list((tmp_path / "node" / LOCAL_COPIES_FOLDER).rglob("a.bin"))
    assert len(copies) == 1
    gets = s3.requests.gets("corpus/a.bin"), s3.requests.gets("corpus/a.idx")
    manager.setup(None, tmp_path / "node")
    assert (s3.requests.gets("corpus/a.bin"), s3.requests.gets("corpus/a.idx")) == gets  # both copies are reused


def test_index_and_metadata_files_on_s3_are_fetched_once_per_node(tmp_path: Path, s3) -> None:
    from tokenized_writers import write_datatrove, write_litdata

    write_datatrove(tmp_path / "dt", "000.ds", documents(30, seed=19))
    write_litdata(tmp_path / "lt", documents(30, seed=20), tokens_loader=True)
    for folder in ("dt", "lt"):
        for path in sorted((tmp_path / folder).iterdir()):
            s3.put(f"{folder}/{path.name}", path.read_bytes())
    small = ("dt/000.ds.index", "dt/000.ds.metadata", "lt/index.json")
    for folder in ("dt", "lt"):
        TokenizedDatasetManager(f"{s3.url}/{folder}/", storage_options=s3.storage_options).setup(None, tmp_path / "node")
    fetched = [s3.requests.gets(name) for name in small]
    assert fetched == [1, 1, 1]  # detecting the format and reading it share the copy
    for folder in ("dt", "lt"):
        TokenizedDatasetManager(f"{s3.url}/{folder}/", storage_options=s3.storage_options).setup(None, tmp_path / "node")
    assert [s3.requests.gets(name) for name in small] == fetched


def test_headers_on_s3_are_read_once_per_node(tmp_path: Path, s3) -> None:
    from tokenized_writers import EOS, write_llmc

    paths = write_llmc(tmp_path / "llmc", documents(40, seed=21), shard_tokens=300)
    for path in paths:
        s3.put(f"llmc/{path.name}", path.read_bytes())
    manager = TokenizedDatasetManager(f"{s3.url}/llmc/", eos_id=EOS, storage_options=s3.storage_options)
    first = manager.setup(None, tmp_path / "node")
    assert first.format == "llmc" and len(paths) > 1
    gets = [s3.requests.gets(f"llmc/{path.name}") for path in paths]
    again = manager.setup(None, tmp_path / "node")  # detection and the reader find the kept headers
    assert [s3.requests.gets(f"llmc/{path.name}") for path in paths] == gets
    assert len(again) == len(first)


def test_a_file_replaced_between_open_and_copy_is_named_and_not_kept(tmp_path: Path, s3) -> None:
    from lightning_tune_data.managers import DataSourceError

    for number in range(10):  # more index files than are checked one by one: checked with one listing
        write_megatron(tmp_path / "corpus" / f"p{number}", documents(5, seed=number))
    for path in sorted((tmp_path / "corpus").iterdir()):
        s3.put(f"corpus/{path.name}", path.read_bytes())
    files = CorpusFiles(f"{s3.url}/corpus/", s3.storage_options, tmp_path / "node", "source 'web'")
    names = list(files.listing())
    bins, indexes = [n for n in names if n.endswith(".bin")], [n for n in names if n.endswith(".idx")]
    same_size = (tmp_path / "corpus" / "p3.bin").read_bytes()[::-1]
    s3.put("corpus/p3.bin", same_size)  # replaced after the corpus was opened, before this node copied it
    with pytest.raises(DataSourceError, match=r"source 'web': s3://.*/corpus/p3\.bin changed since the corpus was "
                                              r"opened .*Restart the run .*pinned copy"):
        files.local(bins[3])
    assert files.local(bins[2]).endswith("p2.bin")  # an unchanged file is copied
    s3.put("corpus/p7.idx", (tmp_path / "corpus" / "p7.idx").read_bytes() + b"\0")
    with pytest.raises(DataSourceError, match=r"corpus/p7\.idx changed since the corpus was opened .*now\)"):
        files.read_many(indexes)
    with pytest.raises(DataSourceError, match=r"corpus/p7\.idx changed"):
        files.read_heads({indexes[7]: 4})
    kept = {path.name for path in (tmp_path / "node" / LOCAL_COPIES_FOLDER).rglob("*") if path.is_file()}
    assert kept == {"p2.bin"}  # nothing of a changed file, nor of a batch holding one, was kept
