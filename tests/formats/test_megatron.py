"""Megatron .bin/.idx pairs written by Megatron-Core, read in place and compared with its own reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenized_writers import documents, megatron_documents, write_megatron

from lightning_tune_data import TokenizedDatasetManager
from lightning_tune_data.formats.megatron import read_megatron_index
from lightning_tune_data.managers import DataSourceError


def rows(corpus) -> list[np.ndarray]:
    column = corpus.table().column("input_ids")
    return [column[i].values.to_numpy() for i in range(len(corpus))]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_every_sequence_reads_as_megatrons_indexed_dataset_reads_it(tmp_path: Path, dtype) -> None:
    write_megatron(tmp_path / "corpus" / "a_text_document", documents(40, seed=1), dtype=dtype)
    write_megatron(tmp_path / "corpus" / "b_text_document", documents(25, seed=2), dtype=dtype)
    corpus = TokenizedDatasetManager(str(tmp_path / "corpus")).setup(None, tmp_path / "cache")
    expected = megatron_documents(tmp_path / "corpus" / "a_text_document") + megatron_documents(
        tmp_path / "corpus" / "b_text_document")
    assert corpus.format == "megatron" and corpus.dtype == np.dtype(dtype).name
    got = rows(corpus)
    assert len(got) == len(expected) == 65
    assert all(np.array_equal(a, b) for a, b in zip(got, expected))


def test_a_bin_without_its_idx_fails_at_setup_naming_the_file(tmp_path: Path) -> None:
    write_megatron(tmp_path / "corpus" / "a", documents(5, seed=1))
    write_megatron(tmp_path / "corpus" / "b", documents(5, seed=2))
    (tmp_path / "corpus" / "b.idx").unlink()
    with pytest.raises(DataSourceError, match=r"b\.bin has no b\.idx beside it") as error:
        TokenizedDatasetManager(str(tmp_path / "corpus")).setup(None, tmp_path / "cache")
    assert "\n" not in str(error.value)


def test_a_truncated_bin_fails_naming_its_size_and_the_indexs(tmp_path: Path) -> None:
    write_megatron(tmp_path / "corpus" / "a", documents(5, seed=1))
    data = (tmp_path / "corpus" / "a.bin").read_bytes()
    (tmp_path / "corpus" / "a.bin").write_bytes(data[:-6])
    with pytest.raises(DataSourceError, match=rf"a\.bin has {len(data) - 6} bytes but its index says {len(data)}"):
        TokenizedDatasetManager(str(tmp_path / "corpus"), format="megatron").setup(None, tmp_path / "cache")


def test_a_dtype_contradicting_the_index_fails(tmp_path: Path) -> None:
    write_megatron(tmp_path / "corpus" / "a", documents(5, seed=1), dtype=np.uint16)
    with pytest.raises(DataSourceError, match=r"dtype='int32' but .*a\.idx records uint16"):
        TokenizedDatasetManager(str(tmp_path / "corpus"), dtype="int32").setup(None, tmp_path / "cache")


def test_an_index_of_other_bytes_is_refused() -> None:
    with pytest.raises(ValueError, match="is not a Megatron index"):
        read_megatron_index(b"not an index at all, just bytes", "x.idx", "source 'web'")


def test_ids_beyond_the_vocabulary_are_named_when_their_file_is_first_read(tmp_path: Path) -> None:
    from lightning_tune_data.sources.corpus_source import CorpusSource

    docs = documents(10, seed=19)
    docs[4][2] = 1500
    write_megatron(tmp_path / "corpus" / "a", docs)
    corpus = TokenizedDatasetManager(str(tmp_path / "corpus"), vocab_size=1000).setup(None, tmp_path / "cache")
    position = sum(len(doc) for doc in docs[:4]) + 2
    with pytest.raises(ValueError, match=rf"a\.bin holds id 1500 at token {position} .*vocabulary of 1000"):
        next(iter(CorpusSource(corpus, "web")))
    with pytest.raises(ValueError, match=r"a\.bin holds id 1500"):
        CorpusSource(corpus, "web").read_block()  # the packers' path
    wide = TokenizedDatasetManager(str(tmp_path / "corpus"), vocab_size=70_000).setup(None, tmp_path / "cache")
    assert wide.id_check is None  # uint16 ids always fit: nothing to read
    next(iter(CorpusSource(wide, "web")))
