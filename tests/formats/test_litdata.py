"""LitData datasets written by LitData's BinaryWriter (what optimize runs), compared with its
StreamingDataset."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenized_writers import documents, litdata_documents, litdata_token_stream, write_litdata

from lightning_tune_data import TokenizedDatasetManager
from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.managers import DataSourceError


def rows(corpus) -> list[np.ndarray]:
    column = corpus.table().column("input_ids")
    return [column[i].values.to_numpy() for i in range(len(corpus))]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_pytree_items_are_read_in_place_as_litdatas_streaming_dataset_reads_them(tmp_path: Path, dtype) -> None:
    docs = documents(30, seed=12)
    write_litdata(tmp_path / "corpus", docs, tokens_loader=False, dtype=dtype)
    root = StoreRoot(str(tmp_path / "c"), cache_budget=1 << 20)  # a budget changes nothing: no copy to count
    corpus = TokenizedDatasetManager(str(tmp_path / "corpus")).setup(None, root)
    theirs = litdata_documents(tmp_path / "corpus")
    assert corpus.format == "litdata" and len(corpus.files) > 1
    assert all(Path(entry.path).name.startswith("chunk-") for entry in corpus.files)  # no decoded copy
    assert not (tmp_path / "c").exists() or not list((tmp_path / "c").rglob("tokens.npy"))
    assert len(rows(corpus)) == len(theirs) == 30
    assert all(np.array_equal(a, b) for a, b in zip(rows(corpus), theirs))
    assert [corpus[i]["input_ids"] for i in (0, 29)] == [docs[0].tolist(), docs[29].tolist()]


def test_pytree_items_in_place_batch_as_the_same_documents_back_to_back(tmp_path: Path) -> None:
    """Items between size headers (list views) and the same documents back to back (TokensLoader):
    the same batches under every packing, and the headers are never taken for ids."""
    from lightning_tune_data import TextDataModule

    docs = documents(80, seed=18, vocab=50, eos=None)  # size headers (2 x len) exceed this vocabulary
    write_litdata(tmp_path / "items", docs, tokens_loader=False)
    write_litdata(tmp_path / "tokens", docs, tokens_loader=True)
    for packing in [None, "concat", "best_fit"]:
        batches = []
        for layout in ("items", "tokens"):
            manager = TokenizedDatasetManager(str(tmp_path / layout), vocab_size=50)
            dm = TextDataModule({"train": {"web": manager}}, max_seq_len=24, batch_size=4, seed=3,
                                cache_dir=str(tmp_path / f"cache-{layout}"), packing=packing)
            dm.prepare_data()
            dm.setup("fit")
            batches.append([batch["input_ids"] for batch, _ in zip(dm.train_dataloader(), range(6))])
        assert len(batches[0]) == 6 and all(torch.equal(a, b) for a, b in zip(*batches)), packing


def test_tokens_loader_chunks_are_read_in_place_one_document_per_item(tmp_path: Path) -> None:
    docs = documents(30, seed=13)
    write_litdata(tmp_path / "corpus", docs, tokens_loader=True)
    corpus = TokenizedDatasetManager(str(tmp_path / "corpus")).setup(None, tmp_path / "c")
    assert all(Path(entry.path).name.startswith("chunk-") for entry in corpus.files)  # no decoded copy
    assert [r.tolist() for r in rows(corpus)] == [d.tolist() for d in docs]
    assert np.array_equal(np.concatenate(rows(corpus)), litdata_token_stream(tmp_path / "corpus"))


def test_compressed_chunks_are_refused_with_the_fix(tmp_path: Path) -> None:
    write_litdata(tmp_path / "corpus", documents(5, seed=14), tokens_loader=True)
    index = tmp_path / "corpus" / "index.json"
    content = json.loads(index.read_text())
    content["config"]["compression"] = "zstd"
    index.write_text(json.dumps(content))
    with pytest.raises(DataSourceError, match="compression=None"):
        TokenizedDatasetManager(str(tmp_path / "corpus")).setup(None, tmp_path / "c")


def test_int64_ids_left_unaligned_by_the_chunk_header_are_copied_out_once(tmp_path: Path) -> None:
    docs = documents(9, seed=20)  # a chunk header of 4 * (items + 2) bytes: odd item counts misalign int64
    write_litdata(tmp_path / "corpus", docs, tokens_loader=True, dtype=np.int64)
    corpus = TokenizedDatasetManager(str(tmp_path / "corpus")).setup(None, tmp_path / "c")
    assert corpus.dtype == "int64"
    assert {Path(entry.path).name.startswith("chunk-") for entry in corpus.files} == {True, False}  # both kinds
    assert [r.tolist() for r in rows(corpus)] == [d.tolist() for d in docs]
    assert np.array_equal(np.concatenate(rows(corpus)), litdata_token_stream(tmp_path / "corpus"))
