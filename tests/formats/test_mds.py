"""MDS datasets written by MosaicML Streaming's MDSWriter (zstd or not), compared with its reader."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenized_writers import documents, mds_documents, write_mds

from lightning_tune_data import TokenizedDatasetManager
from lightning_tune_data.managers import DataSourceError


def rows(corpus) -> list[np.ndarray]:
    column = corpus.table().column("input_ids")
    return [column[i].values.to_numpy() for i in range(len(corpus))]


@pytest.mark.parametrize(("compression", "dtype"), [("zstd", "int32"), (None, "uint16")])
def test_samples_read_as_streamings_reader_reads_them(tmp_path: Path, compression, dtype) -> None:
    docs = documents(30, seed=15)
    write_mds(tmp_path / "corpus", docs, compression, dtype)
    corpus = TokenizedDatasetManager(str(tmp_path / "corpus")).setup(None, tmp_path / "c")
    ours = rows(corpus)
    theirs = mds_documents(tmp_path / "corpus")
    assert corpus.format == "mds" and corpus.dtype == dtype and len(corpus.files) > 1
    assert len(ours) == len(theirs) == 30
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs))


def test_a_missing_shard_or_column_fails_naming_it(tmp_path: Path) -> None:
    write_mds(tmp_path / "corpus", documents(30, seed=16), "zstd")
    with pytest.raises(DataSourceError, match=r"has columns \['id', 'tokens'\]; set column"):
        TokenizedDatasetManager(str(tmp_path / "corpus"), column="text").setup(None, tmp_path / "c")
    (tmp_path / "corpus" / "shard.00001.mds.zstd").unlink()
    with pytest.raises(DataSourceError, match=r"lists shard\.00001\.mds\.zstd .* it is missing"):
        TokenizedDatasetManager(str(tmp_path / "corpus")).setup(None, tmp_path / "c")
