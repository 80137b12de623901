"""Opening a committed local store: its commit says which shards hold the rows, in order; each
shard's size is checked against the commit and the shards are memory-mapped as one dataset.

Opening reads no shard bytes, so it costs the same for a store of a megabyte or a terabyte; a
truncated, missing or replaced shard names itself here instead of failing inside Arrow later.
Same-size corruption is caught by the checksums (when the store is written, downloaded, or a
changed file is reused, see :mod:`lightning_tune_data.cache.verified`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import datasets

from lightning_tune_data.cache.marker import read_cache_metadata
from lightning_tune_data.cache.saved_dataset import open_dataset
from lightning_tune_data.cache.shards import open_shards

__all__ = ["open_store", "store_shards"]


def store_shards(content: dict[str, Any] | None) -> list[str] | None:
    """The shards of a commit in row order, ``None`` when it describes no token store."""
    store = (content or {}).get("store")
    if not isinstance(store, dict) or not isinstance(store.get("shards"), list):
        return None
    return [shard["path"] for shard in store["shards"]]


def open_store(folder: Path, content: dict[str, Any] | None = None) -> tuple[datasets.Dataset | None, str | None]:
    """Memory-map a committed local store after checking its shards' sizes.

    Args:
        folder: The store folder.
        content: Its commit, when already read.

    Returns:
        ``(dataset, None)``, or ``(None, what is wrong)``.
    """
    content = content if content is not None else read_cache_metadata(folder)
    shards = store_shards(content)
    if shards is None:  # built by an earlier version
        return open_dataset(folder)
    recorded = (content or {}).get("files") or {}
    for relative in shards:
        path = folder / relative
        try:
            size = os.stat(path).st_size
        except OSError:
            return None, f"shard {relative} is missing"
        expected = (recorded.get(relative) or {}).get("size")
        if size != expected:
            return None, f"shard {relative} has {size} bytes, {expected} were written (truncated or overwritten)"
    try:
        fingerprint = ((content or {}).get("metadata") or {}).get("fingerprint")
        dataset = open_shards(folder, shards, f"store-{fingerprint[:48]}" if fingerprint else None)
    except Exception as error:  # noqa: BLE001 - any failure to open means a corrupt store
        return None, f"the shards do not open ({type(error).__name__}: {error})"
    rows = content["store"].get("rows")
    if len(dataset) != rows:
        return None, f"it holds {len(dataset)} rows, {rows} were written"
    return dataset, None
