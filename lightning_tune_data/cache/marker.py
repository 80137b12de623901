"""The completion marker: the file that makes a cache folder a finished cache.

A cache folder is *valid* only when it holds ``_COMPLETE.json``, written last by the atomic build
(:mod:`lightning_tune_data.cache.store`), in this package's cache format, and, where the reader
asks, with the metadata the reader expects.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning_tune_data.version as package_version
from lightning_tune_data.cache.fingerprints import CACHE_FORMAT_VERSION, canonical_json

__all__ = ["COMPLETE_MARKER", "is_valid_cache", "marker_content", "marker_matches", "read_cache_metadata"]

#: Name of the completion marker, written last into a finished cache directory.
COMPLETE_MARKER = "_COMPLETE.json"


def marker_content(metadata: Mapping[str, Any], inputs: Mapping[str, Any], description: str,
                   files: Mapping[str, Any], store: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What a completion marker holds: format and package version, the metadata a reader requires,
    what the cache was built from, every file's size and checksum and, for a token store, its
    shards in row order with their row and token counts.

    Args:
        metadata: Must equal what a reader expects (fingerprint, manager).
        inputs: What the cache was built from (so later builds can say what changed).
        description: Names the cache's source.
        files: ``{relative path: {"size", "xxh3_128"}}`` of every file but the marker.
        store: The store's shards and counts.
    """
    content = {
        "cache_format": CACHE_FORMAT_VERSION,
        "package_version": package_version.__version__,
        "metadata": dict(metadata),
        "inputs": dict(inputs),
        "description": description,
        "files": dict(files),
    }
    if store is not None:
        content["store"] = dict(store)
    return content


def marker_matches(content: Any, metadata: Mapping[str, Any] | None = None) -> bool:
    """Whether parsed marker ``content`` is in this package's format and (if given) has ``metadata``.

    Args:
        content: The marker's parsed JSON (or ``None``).
        metadata: What the reader requires, compared canonically.
    """
    if not isinstance(content, dict) or content.get("cache_format") != CACHE_FORMAT_VERSION:
        return False
    return metadata is None or canonical_json(content.get("metadata")) == canonical_json(dict(metadata))


def read_cache_metadata(cache_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Return the marker contents of a complete cache, or ``None`` if there is no valid marker.

    Args:
        cache_dir: The cache folder.
    """
    marker = Path(cache_dir) / COMPLETE_MARKER
    try:
        with open(marker, encoding="utf-8") as handle:
            content = json.load(handle)
    except (OSError, ValueError):
        return None
    if not isinstance(content, dict) or content.get("cache_format") != CACHE_FORMAT_VERSION:
        return None
    return content


def is_valid_cache(
    cache_dir: str | os.PathLike[str], metadata: Mapping[str, Any] | None = None
) -> bool:
    """Whether ``cache_dir`` is a finished cache (its completion marker exists and parses).

    Args:
        cache_dir: The cache directory.
        metadata: If given, the marker's metadata must also equal it (compared canonically).
    """
    if not Path(cache_dir).is_dir():
        return False
    content = read_cache_metadata(cache_dir)
    if content is None:
        return False
    if metadata is None:
        return True
    return canonical_json(content.get("metadata")) == canonical_json(dict(metadata))
