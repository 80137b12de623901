"""nanoGPT raw .bin ids and llm.c shards (header, delimiter before each document, documents
straddling files)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenized_writers import EOS, documents, write_llmc, write_raw

from lightning_tune_data import TokenizedDatasetManager
from lightning_tune_data.formats.nanogpt import llmc_header
from lightning_tune_data.managers import DataSourceError


def rows(corpus) -> list[list[int]]:
    column = corpus.table().column("input_ids")
    return [column[i].values.to_numpy().tolist() for i in range(len(corpus))]


def test_nanogpt_files_are_cut_after_each_eos(tmp_path: Path) -> None:
    docs = documents(25, seed=9)
    write_raw(tmp_path / "corpus" / "train.bin", docs[:15])
    write_raw(tmp_path / "corpus" / "val.bin", docs[15:])
    corpus = TokenizedDatasetManager(str(tmp_path / "corpus"), eos_id=EOS).setup(None, tmp_path / "c")
    assert corpus.format == "nanogpt" and rows(corpus) == [d.tolist() for d in docs[:15]] + [d.tolist() for d in docs[15:]]


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_llmc_documents_straddling_files_are_joined_and_none_is_lost(tmp_path: Path, dtype: str) -> None:
    docs = [np.concatenate([[EOS], doc[:-1]]) for doc in documents(30, seed=10, longest=60)]
    docs[7] = np.concatenate([[EOS], np.arange(1, 90)])  # longer than a shard: spans three files
    paths = write_llmc(tmp_path / "corpus", docs, shard_tokens=40, dtype=dtype)
    assert llmc_header(paths[0].read_bytes()[:12])[0] == (20240520 if dtype == "uint16" else 20240801)
    corpus = TokenizedDatasetManager(str(tmp_path / "corpus"), eos_id=EOS).setup(None, tmp_path / "c")
    assert corpus.format == "llmc" and corpus.dtype == dtype
    assert rows(corpus) == [d.tolist() for d in docs]


def test_llmc_header_contradictions_and_truncation_fail_naming_the_file(tmp_path: Path) -> None:
    docs = [np.concatenate([[EOS], doc[:-1]]) for doc in documents(10, seed=11)]
    paths = write_llmc(tmp_path / "corpus", docs, shard_tokens=1000)
    with pytest.raises(DataSourceError, match=r"train_000000\.bin's header .* means uint16 ids, contradicting dtype='uint32'"):
        TokenizedDatasetManager(str(tmp_path / "corpus"), eos_id=EOS, dtype="uint32").setup(None, tmp_path / "c")
    paths[0].write_bytes(paths[0].read_bytes()[:-4])
    with pytest.raises(DataSourceError, match=r"train_000000\.bin has \d+ bytes but its header says \d+ tokens"):
        TokenizedDatasetManager(str(tmp_path / "corpus"), eos_id=EOS).setup(None, tmp_path / "c")
