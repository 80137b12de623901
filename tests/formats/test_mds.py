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


@pytest.mark.parametrize(("compression", "dtype", "longest", "in_place"),
                         [("zstd", "int32", 40, False), (None, "uint16", 40, False), (None, "int32", 400, False),
                          (None, "uint8", 40, True)])
def test_samples_read_as_streamings_reader_reads_them(tmp_path: Path, compression, dtype, longest, in_place) -> None:
    """Uncompressed shards whose ids all lie aligned (here: uint8 ids) are read in place; others
    (ids after 2- or 3-byte shape headers, compressed shards) are decoded once into a kept copy."""
    docs = [doc % 250 for doc in documents(30, seed=15, longest=longest)]
    write_mds(tmp_path / "corpus", docs, compression, dtype)
    corpus = TokenizedDatasetManager(str(tmp_path / "corpus")).setup(None, tmp_path / "c")
    ours = rows(corpus)
    theirs = mds_documents(tmp_path / "corpus")
    assert corpus.format == "mds" and corpus.dtype == dtype and len(corpus.files) > 1
    assert len(ours) == len(theirs) == 30
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs))
    assert all((entry.starts is not None) == in_place for entry in corpus.files)
    assert bool(list((tmp_path / "c").rglob("tokens.npy"))) != in_place  # a decoded copy only when needed


def test_a_missing_shard_or_column_fails_naming_it(tmp_path: Path) -> None:
    write_mds(tmp_path / "corpus", documents(30, seed=16), "zstd")
    with pytest.raises(DataSourceError, match=r"has columns \['id', 'tokens'\]; set column"):
        TokenizedDatasetManager(str(tmp_path / "corpus"), column="text").setup(None, tmp_path / "c")
    (tmp_path / "corpus" / "shard.00001.mds.zstd").unlink()
    with pytest.raises(DataSourceError, match=r"lists shard\.00001\.mds\.zstd .* it is missing"):
        TokenizedDatasetManager(str(tmp_path / "corpus")).setup(None, tmp_path / "c")


def test_a_budget_decodes_into_the_node_cache_and_no_budget_keeps_a_copy_on_the_same_node(tmp_path: Path) -> None:
    from lightning_tune_data.cache.root import StoreRoot
    from lightning_tune_data.formats.ranged import RangedCorpus
    from lightning_tune_data.sources.corpus_source import CorpusSource

    write_mds(tmp_path / "corpus", documents(40, seed=19), "zstd")
    manager = TokenizedDatasetManager(str(tmp_path / "corpus"))
    budgeted = manager.setup(None, StoreRoot(str(tmp_path / "node"), cache_budget=1 << 20))
    assert isinstance(budgeted, RangedCorpus) and not list((tmp_path / "node").rglob("tokens.npy"))
    ids = sorted(s["input_ids"].tolist() for s in CorpusSource(budgeted, "x", shuffle=False, num_passes=1))
    budgeted.cache.close()
    kept = manager.setup(None, StoreRoot(str(tmp_path / "node")))  # the boundaries kept above are reused
    assert not isinstance(kept, RangedCorpus) and list((tmp_path / "node").rglob("tokens.npy"))
    assert sorted(r.tolist() for r in rows(kept)) == ids == sorted(d.tolist() for d in mds_documents(tmp_path / "corpus"))


def test_a_sample_header_beyond_the_shard_fails_naming_the_shard(tmp_path: Path) -> None:
    import json

    write_mds(tmp_path / "corpus", documents(20, seed=23), None, "uint16")
    index = json.loads((tmp_path / "corpus" / "index.json").read_text())
    shard = tmp_path / "corpus" / index["shards"][0]["raw_data"]["basename"]
    data = bytearray(shard.read_bytes())  # rewritten at the same size
    count = int(np.frombuffer(bytes(data[:4]), "<u4")[0])
    last = int(np.frombuffer(bytes(data[4 * count : 4 * count + 4]), "<u4")[0])  # the last sample's offset
    data[last : last + 4] = np.array([1 << 30], "<u4").tobytes()  # its tokens column claims 1 GB
    shard.write_bytes(bytes(data))
    with pytest.raises(DataSourceError, match=r"shard\.00000\.mds: a sample reaches beyond the shard's \d+ bytes"):
        TokenizedDatasetManager(str(tmp_path / "corpus")).setup(None, tmp_path / "c")


def test_a_budget_too_small_for_two_decoded_shards_says_how_much_is_needed(tmp_path: Path) -> None:
    from lightning_tune_data.cache.root import StoreRoot

    write_mds(tmp_path / "corpus", documents(40, seed=24), "zstd")
    with pytest.raises(ValueError, match=r"cannot hold two decoded shards of its files .* at least"):
        TokenizedDatasetManager(str(tmp_path / "corpus")).setup(None, StoreRoot(str(tmp_path / "node"), cache_budget=256))
