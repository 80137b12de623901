"""A committed store built by ``prepare_data`` on local disk, read through a node cache as if it
were remote: what the shard-by-shard reading tests share."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import make_texts, write_jsonl

from lightning_tune_data import LocalDatasetManager, TextDataModule
from lightning_tune_data.cache.cached_store import CachedStore
from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.cache.store_files import StoreFiles


def committed_store(root: Path, documents: int, seed: int) -> tuple[Path, list[list[int]]]:
    """A store of ``documents`` generated documents in 1 KB shards under ``root``: its folder
    and its rows as written."""
    data = write_jsonl(root / "docs.jsonl", make_texts(documents, seed=seed, min_words=5, max_words=30))
    datamodule = TextDataModule({"train": {"docs": LocalDatasetManager(data_files=[str(data)])}}, max_seq_len=64,
                                cache_dir=str(root / "cache"), shard_size="1KB")
    datamodule.prepare_data()
    datamodule.setup("fit")
    [folder] = [p.parent for p in (root / "cache").glob("docs-*/_COMPLETE.json")]
    return folder, [list(ids) for ids in datamodule.dataset("train", "docs")["input_ids"]]


def cached(folder: Path, node: Path, budget: int = 1 << 30, window: int = 2, block_rows: int = 8) -> CachedStore:
    """The store at ``folder`` read through a node cache under ``node``, in windows of ``window``
    blocks of ``block_rows`` rows."""
    content = json.loads((folder / "_COMPLETE.json").read_text())
    files = StoreFiles(StoreRoot(str(folder.parent)), folder.name)
    return CachedStore(files, content, node / folder.name, budget, {"block_rows": block_rows, "window_blocks": window},
                       "source 'docs'")
