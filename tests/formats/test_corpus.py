"""The common corpus description: a zero-copy table over the files, pickled as its description,
and a file that changes after open named."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from lightning_tune_data.formats.corpus import CorpusFile, TokenCorpus


def corpus_over(path: Path) -> TokenCorpus:
    np.arange(10, dtype=np.uint16).tofile(path)
    stat = os.stat(path)
    entry = CorpusFile(str(path), "uint16", np.array([0, 3, 10]), path=str(path),
                       identity=[{"url": str(path), "size": stat.st_size, "stamp": str(stat.st_mtime_ns)}])
    joined = CorpusFile("joined", "uint16", np.array([0, 2]), tokens=np.array([7, 8], np.uint16))
    return TokenCorpus([entry, joined, CorpusFile("empty", "uint16", np.array([0]))], "nanogpt", str(path))


def test_the_table_reads_the_files_in_place_and_pickles_as_its_description(tmp_path: Path) -> None:
    corpus = corpus_over(tmp_path / "a.bin")
    assert len(corpus) == 3 and corpus.num_tokens == 12 and len(corpus.files) == 2  # the empty file is left out
    column = corpus.table().column("input_ids")
    assert [column[i].values.to_numpy().tolist() for i in range(3)] == [[0, 1, 2], [3, 4, 5, 6, 7, 8, 9], [7, 8]]
    assert corpus[1] == {"input_ids": [3, 4, 5, 6, 7, 8, 9]}
    values = column.chunk(0).values.to_numpy()
    assert isinstance(values.base, np.memmap) or not values.flags.owndata  # a view of the mapping
    copy = pickle.loads(pickle.dumps(corpus))
    assert copy._table is None and copy.table().equals(corpus.table())


def test_a_file_changed_after_open_is_named_when_it_is_mapped(tmp_path: Path) -> None:
    corpus = corpus_over(tmp_path / "a.bin")
    np.arange(12, dtype=np.uint16).tofile(tmp_path / "a.bin")
    with pytest.raises(ValueError, match=r"a\.bin changed since the corpus was opened \(20 bytes then, 24 bytes now\)"):
        pickle.loads(pickle.dumps(corpus)).table()


def test_documents_apart_in_a_file_are_list_views_and_the_bytes_between_are_never_ids(tmp_path: Path) -> None:
    path = tmp_path / "items.bin"
    np.array([900, 1, 2, 901, 902, 3, 4, 5, 903, 6], dtype=np.uint16).tofile(path)  # 90x: headers between
    stat = os.stat(path)
    entry = CorpusFile(str(path), "uint16", np.array([0, 2, 5, 6]), path=str(path), start=2,
                       starts=np.array([0, 4, 8]),
                       identity=[{"url": str(path), "size": stat.st_size, "stamp": str(stat.st_mtime_ns)}])
    corpus = TokenCorpus([entry, CorpusFile("joined", "uint16", np.array([0, 1]), tokens=np.array([7], np.uint16))],
                         "litdata", str(path))
    assert entry.span == 9 and entry.document_ids().tolist() == [1, 2, 3, 4, 5, 6]
    assert str(corpus.table().column("input_ids").type) == "large_list_view<item: uint16>"
    assert [corpus[i]["input_ids"] for i in range(4)] == [[1, 2], [3, 4, 5], [6], [7]]
    corpus.id_check = (10, str(tmp_path / "node"))  # the headers (900-903) are beyond it, the ids are not
    corpus.check_ids(np.arange(4))
    copy = pickle.loads(pickle.dumps(corpus))
    assert copy.table().equals(corpus.table())
