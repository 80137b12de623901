"""Reading one of our committed stores by its folder or URL (the folder ``prepare`` wrote).

A training node needs no raw inputs and no fingerprint: the store's commit says what it holds.
The commit records the tokenizer the store was written with; it must be the datamodule's. A
local store is memory-mapped in place; a remote one (``s3://...``) is copied to this node
(verified) or, under the datamodule's ``cache_budget``, read shard by shard through the node
cache, exactly as the stores the datamodule finds by fingerprint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning_tune_data.cache.checksums import VerifyMode
from lightning_tune_data.cache.marker import COMPLETE_MARKER, marker_matches
from lightning_tune_data.cache.mirror import download_store
from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.cache.store_files import StoreFiles
from lightning_tune_data.cache.store_reader import open_store
from lightning_tune_data.managers.errors import CacheMissingError, DataSourceError
from lightning_tune_data.managers.source_cache import SourceCache
from lightning_tune_data.tokenizers import Tokenizer

__all__ = ["open_committed_store", "store_files_at"]


def store_files_at(path: str, root: StoreRoot, storage_options: dict[str, Any] | None) -> StoreFiles:
    """The store folder at ``path`` (a local folder or URL), reached with ``storage_options`` (else the
    datamodule's), copied (when remote) into this node's ``local_cache_dir``, read under its budget."""
    path = path.rstrip("/")
    parent, name = path.rsplit("/", 1) if "/" in path else (".", path)
    options = storage_options if storage_options is not None else root.storage_options
    store_root = StoreRoot(parent, options, shard_bytes=root.shard_bytes, cache_budget=root.cache_budget,
                           shuffle_window=root.shuffle_window)
    if store_root.is_remote:
        store_root = StoreRoot(parent, options, root.local_dir, shard_bytes=root.shard_bytes,
                               cache_budget=root.cache_budget, shuffle_window=root.shuffle_window)
    return StoreFiles(store_root, name)


def open_committed_store(files: StoreFiles, tokenizer: Tokenizer | None, description: str,
                         verify_mode: VerifyMode = "checksum") -> Any:
    """The committed store ``files`` as a dataset ``ArrowSource`` reads.

    Args:
        files: the store folder.
        tokenizer: the datamodule's tokenizer (its identity must be the store's), or ``None``.
        description: names the source in errors.
        verify_mode: how a remote store's local copy is checked before it is reused.

    Raises:
        CacheMissingError: no committed store there, or a corrupt one.
        DataSourceError: the store was written with another tokenizer (naming both).
    """
    content = files.read_json(COMPLETE_MARKER)
    if not marker_matches(content) or not isinstance(content.get("store"), dict):
        raise CacheMissingError(
            f"{description}: {files.url()} is not a committed store (no valid {COMPLETE_MARKER}); point path at a "
            "folder `lightning-tune-data prepare` committed (`lightning-tune-data cache list` shows them).")
    recorded = ((content.get("inputs") or {}).get("parts") or {}).get("tokenizer")
    if tokenizer is not None and recorded is not None and recorded != tokenizer.identity:
        raise DataSourceError(
            f"{description}: the store at {files.url()} was written with tokenizer {recorded!r}, but the datamodule's "
            f"is {tokenizer.identity!r}; give the datamodule the store's tokenizer, or prepare the store again.")
    root = files.root
    if root.is_remote:
        metadata = content.get("metadata") or {}
        cache = SourceCache(root, files.name, str(metadata.get("fingerprint", "")), str(metadata.get("manager", "")),
                            description)
        budgeted = cache.budgeted(files, content)
        if budgeted is not None:
            return budgeted
        folder = download_store(files, content, root.local_dir / files.name, description, verify_mode)
    else:
        folder = Path(files.path())
    dataset, problem = open_store(folder, content)
    if problem is not None:
        raise CacheMissingError(f"{description}: the store at {files.url()} is corrupt ({problem}); prepare it again.")
    return dataset
