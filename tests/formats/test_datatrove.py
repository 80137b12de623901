"""datatrove tokenized files written by datatrove's TokenizedFile, with loss masks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenized_writers import datatrove_windows, documents, write_datatrove

from lightning_tune_data import TokenizedDatasetManager
from lightning_tune_data.keys import INPUT_IDS, LOSS_MASK
from lightning_tune_data.managers import DataSourceError
from lightning_tune_data.sources.corpus_source import CorpusSource


def test_documents_and_loss_masks_read_as_written_and_as_datatroves_reader_streams_them(tmp_path: Path) -> None:
    docs = documents(30, seed=3)
    rng = np.random.default_rng(0)
    losses = [rng.random(len(doc)) < 0.7 for doc in docs]
    write_datatrove(tmp_path / "corpus", "000_web.ds", docs[:20], losses[:20])
    write_datatrove(tmp_path / "corpus", "001_web.ds", docs[20:], losses[20:])
    corpus = TokenizedDatasetManager(str(tmp_path / "corpus")).setup(None, tmp_path / "cache")
    assert corpus.format == "datatrove" and corpus.dtype == "uint16" and corpus.has_loss_mask
    table = corpus.table()
    for row, (doc, loss) in enumerate(zip(docs, losses)):
        assert np.array_equal(table.column(INPUT_IDS)[row].values.to_numpy(), doc)
        assert np.array_equal(table.column(LOSS_MASK)[row].values.to_numpy().astype(bool), loss)
    stream = np.concatenate([table.column(INPUT_IDS)[row].values.to_numpy() for row in range(20)])
    windows = datatrove_windows(tmp_path / "corpus" / "000_web.ds", seq_len=15)
    assert len(windows) == len(stream) // 16
    for i, window in enumerate(windows):
        assert np.array_equal(window, stream[i * 16 : (i + 1) * 16])
    source = CorpusSource(corpus, "web", shuffle=False)
    first = next(iter(source))
    assert np.array_equal(first[INPUT_IDS], docs[0]) and np.array_equal(first[LOSS_MASK], losses[0])


def test_four_byte_tokens_are_read_as_the_metadata_records(tmp_path: Path) -> None:
    docs = [doc + 70_000 for doc in documents(10, seed=4)]
    write_datatrove(tmp_path / "corpus", "000.ds", docs, token_size=4)
    corpus = TokenizedDatasetManager(str(tmp_path / "corpus")).setup(None, tmp_path / "cache")
    assert corpus.dtype == "uint32"
    assert np.array_equal(corpus.table().column(INPUT_IDS)[9].values.to_numpy(), docs[9])
    with pytest.raises(DataSourceError, match=r"dtype='uint16' but .*000\.ds\.metadata records uint32"):
        TokenizedDatasetManager(str(tmp_path / "corpus"), dtype="uint16").setup(None, tmp_path / "cache")


def test_a_ds_without_its_index_fails_naming_it(tmp_path: Path) -> None:
    write_datatrove(tmp_path / "corpus", "000.ds", documents(5, seed=1))
    (tmp_path / "corpus" / "000.ds.index").unlink()
    with pytest.raises(DataSourceError, match=r"000\.ds has no \.ds\.index beside it"):
        TokenizedDatasetManager(str(tmp_path / "corpus")).setup(None, tmp_path / "cache")
