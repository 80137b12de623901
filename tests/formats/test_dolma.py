"""Dolma / OLMo token files: header-less .npy ids cut at EOS or by a .csv.gz beside them."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from tokenized_writers import EOS, documents, write_raw

from lightning_tune_data import TokenizedDatasetManager
from lightning_tune_data.managers import DataSourceError


def rows(corpus) -> list[np.ndarray]:
    column = corpus.table().column("input_ids")
    return [column[i].values.to_numpy() for i in range(len(corpus))]


def test_documents_end_at_eos_and_a_tail_without_one_is_kept(tmp_path: Path) -> None:
    docs = documents(20, seed=5)
    tail = np.array([5, 6, 7])
    write_raw(tmp_path / "corpus" / "part-0-00000.npy", docs + [tail], "uint32")
    corpus = TokenizedDatasetManager(str(tmp_path / "corpus"), eos_id=EOS, dtype="uint32").setup(None, tmp_path / "c")
    assert corpus.format == "dolma"
    assert [list(r) for r in rows(corpus)] == [list(d) for d in docs] + [[5, 6, 7]]


def test_a_csv_gz_beside_the_file_cuts_the_documents(tmp_path: Path) -> None:
    docs = documents(6, seed=6, eos=None)
    write_raw(tmp_path / "corpus" / "part-0.npy", docs)
    ends = np.cumsum([len(d) for d in docs])
    lines = [f"{start},{end},doc{i},web" for i, (start, end) in enumerate(zip([0, *ends[:-1]], ends))]
    (tmp_path / "corpus" / "part-0.csv.gz").write_bytes(gzip.compress("\n".join(lines).encode()))
    corpus = TokenizedDatasetManager(str(tmp_path / "corpus")).setup(None, tmp_path / "c")
    assert [list(r) for r in rows(corpus)] == [list(d) for d in docs]


def test_ids_beyond_the_vocabulary_fail_at_setup_naming_the_file_and_position(tmp_path: Path) -> None:
    docs = documents(4, seed=7)
    docs[2][1] = 5000
    write_raw(tmp_path / "corpus" / "part-0.npy", docs)
    position = len(docs[0]) + len(docs[1]) + 1
    manager = TokenizedDatasetManager(str(tmp_path / "corpus"), eos_id=EOS, vocab_size=1000)
    with pytest.raises(DataSourceError, match=rf"part-0\.npy holds id 5000 at token {position} .*vocabulary of 1000"):
        manager.setup(None, tmp_path / "c")


def test_a_real_numpy_file_and_a_missing_eos_id_fail_with_the_fix(tmp_path: Path) -> None:
    write_raw(tmp_path / "corpus" / "part-0.npy", documents(4, seed=8))
    with pytest.raises(DataSourceError, match="set eos_id"):
        TokenizedDatasetManager(str(tmp_path / "corpus")).setup(None, tmp_path / "c")
    (tmp_path / "real").mkdir()
    np.save(tmp_path / "real" / "x.npy", np.arange(10))
    with pytest.raises(DataSourceError, match="is a NumPy file with a header"):
        TokenizedDatasetManager(str(tmp_path / "real"), format="dolma", eos_id=EOS).setup(None, tmp_path / "c")
