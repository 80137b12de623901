"""Document boundaries from delimiter positions, and the scan kept once per file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lightning_tune_data.formats.delimited import delimiter_positions, documents_ending_at, documents_starting_at
from lightning_tune_data.formats.files import CorpusFiles
from lightning_tune_data.formats.kept import kept_folder
from lightning_tune_data.formats.options import FormatOptions


def test_documents_ending_at_a_delimiter_keep_a_tail() -> None:
    assert documents_ending_at(np.array([2, 4]), 5).tolist() == [0, 3, 5]
    assert documents_ending_at(np.array([2, 4]), 5).tolist()[-1] == 5
    assert documents_ending_at(np.array([4]), 5).tolist() == [0, 5]
    assert documents_ending_at(np.zeros(0, np.int64), 3).tolist() == [0, 3]


def test_documents_starting_at_a_delimiter_join_across_files(tmp_path: Path) -> None:
    first, second = np.array([9, 1, 2, 9, 3], np.uint16), np.array([4, 5, 9, 6], np.uint16)
    first.tofile(tmp_path / "a"), second.tofile(tmp_path / "b")
    files = documents_starting_at([("a", str(tmp_path / "a"), 0, 5, np.array([0, 3]), []),
                                   ("b", str(tmp_path / "b"), 0, 4, np.array([2]), [])], "uint16")
    got = [entry.token_array()[a:b].tolist() for entry in files for a, b in zip(entry.offsets[:-1], entry.offsets[1:])]
    assert got == [[9, 1, 2], [9, 3, 4, 5], [9, 6]]


def test_the_scan_is_kept_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "x.bin"
    np.array([1, 7, 2, 7], np.uint16).tofile(path)
    files = CorpusFiles(str(path), None, tmp_path / "node", "source 'x'")
    options = FormatOptions("source 'x'", tmp_path / "node")
    name = next(iter(files.listing()))
    assert delimiter_positions(files, name, str(path), "uint16", 0, 4, 7, options).tolist() == [1, 3]
    identity = {**files.identity(name), "url": f"{files.url(name)}#uint16@0:7"}
    assert (kept_folder(tmp_path / "node", "delimiters", identity) / "done").is_file()
