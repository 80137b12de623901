"""What a source's cache records about itself, and what that lets us say.

Each finished cache stores, in its completion marker, the inputs it was built from: the source
name, the package version and the fingerprint parts (data-file identities, preprocessing,
tokenizer, ...). From them:

* a cache is found by its fingerprint whatever folder name it was given (renaming a source
  does not rebuild it);
* a build says which input changed since the previous build of the same source;
* ``lightning-tune-data cache list`` tells which caches are stale.

Also here: the check that the token ids of a freshly built cache fit the tokenizer.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lightning_tune_data.cache import store as cache
from lightning_tune_data.preprocess import PreprocessError

__all__ = ["describe_changes", "find_cache", "previous_build", "check_token_ids"]


def find_cache(cache_root: str | os.PathLike[str], fingerprint: str, metadata: Mapping[str, Any]) -> Path | None:
    """A complete cache of this fingerprint under ``cache_root``, whatever its name prefix."""
    root = Path(cache_root)
    if not root.is_dir():
        return None
    for candidate in sorted(root.glob(f"*-{fingerprint[:16]}")):
        if candidate.is_dir() and cache.is_valid_cache(candidate, metadata):
            return candidate
    return None


def previous_build(cache_root: str | os.PathLike[str], source_key: str, exclude: Path) -> dict[str, Any] | None:
    """The marker (plus ``"path"``) of the newest other complete cache built for ``source_key``."""
    root = Path(cache_root)
    newest: tuple[float, dict[str, Any]] | None = None
    for marker_path in root.glob(f"*/{cache.COMPLETE_MARKER}"):
        if marker_path.parent == exclude:
            continue
        content = cache.read_cache_metadata(marker_path.parent)
        if not content or (content.get("inputs") or {}).get("source_key") != source_key:
            continue
        stamp = marker_path.stat().st_mtime
        if newest is None or stamp > newest[0]:
            newest = (stamp, {**content, "path": marker_path.parent})
    return None if newest is None else newest[1]


def _files(parts: Mapping[str, Any]) -> dict[str, Any]:
    source = parts.get("source") or {}
    files = {entry["path"]: entry for entry in source.get("data_file_identities") or [] if isinstance(entry, dict)}
    for entry in source.get("local_folder") or []:
        if isinstance(entry, dict):
            files[entry["path"]] = entry
    return files


def describe_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Which inputs differ between two recorded builds (``{"package_version", "parts"}``), in words."""
    changes: list[str] = []
    if old.get("package_version") != new.get("package_version"):
        changes.append(f"the package version changed ({old.get('package_version')} -> {new.get('package_version')})")
    old_parts, new_parts = old.get("parts") or {}, new.get("parts") or {}
    old_files, new_files = _files(old_parts), _files(new_parts)
    for path in sorted(set(old_files) | set(new_files)):
        before, after = old_files.get(path), new_files.get(path)
        name = os.path.basename(path)
        if before is None:
            changes.append(f"data file {name} was added")
        elif after is None:
            changes.append(f"data file {name} was removed")
        elif before != after:
            sizes = f", {before.get('size')} -> {after.get('size')} bytes" if before.get("size") != after.get("size") else ""
            changes.append(f"data file {name} changed (its content{sizes})")
    if old_parts.get("tokenizer") != new_parts.get("tokenizer"):
        changes.append("the tokenizer changed")
    old_pre, new_pre = old_parts.get("preprocess") or {}, new_parts.get("preprocess") or {}
    for key in sorted(set(old_pre) | set(new_pre)):
        if cache.canonical_json(old_pre.get(key)) != cache.canonical_json(new_pre.get(key)):
            if key == "function":
                changes.append("the preprocess function's code changed")
            else:
                name = "preprocess_kwargs" if key == "kwargs" else key
                changes.append(f"{name} changed ({old_pre.get(key)!r} -> {new_pre.get(key)!r})")
    skip = {"data_file_identities", "local_folder"}
    old_src, new_src = old_parts.get("source") or {}, new_parts.get("source") or {}
    for key in sorted((set(old_src) | set(new_src)) - skip):
        if cache.canonical_json(old_src.get(key)) != cache.canonical_json(new_src.get(key)):
            changes.append(f"{key} changed ({old_src.get(key)!r} -> {new_src.get(key)!r})")
    return changes or ["its inputs differ from the previous build"]


def rebuild_reason(cache_root: str | os.PathLike[str], inputs: Mapping[str, Any], final_dir: Path) -> str:
    """Why a build of this source is needed, compared with its newest earlier build."""
    previous = previous_build(cache_root, inputs["source_key"], exclude=final_dir)
    if previous is None:
        return "no earlier build of this source"
    old_inputs = previous.get("inputs") or {}
    old_files, new_files = _files(old_inputs.get("parts") or {}), _files(inputs.get("parts") or {})
    if old_files and new_files and not set(old_files) & set(new_files):
        return "no earlier build of this source"  # another source of the same name (e.g. train and val 'lm')
    size = cache.human_size(cache.tree_size(previous["path"]))
    return (f"{'; '.join(describe_changes(old_inputs, inputs))} since the build in {previous['path'].name} "
            f"({size}, kept; 'lightning-tune-data cache clean' removes stale caches)")


def check_token_ids(dataset: datasets.Dataset, vocab_size: int, tokenizer: Any, description: str) -> None:
    """Fail when a token id is negative or not below ``vocab_size`` (one pass over the column)."""
    column = dataset.data.table.column("input_ids")
    values = pc.list_flatten(column) if isinstance(column.type, (pa.ListType, pa.LargeListType)) else column
    if len(values) == 0:
        return
    bounds = pc.min_max(values)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is None:
        return
    if high < vocab_size and low >= 0:
        return
    bad = high if high >= vocab_size else low
    position = pc.index(values, bad).as_py()  # first occurrence, in the flattened ids
    lengths = np.asarray(pc.list_value_length(column).fill_null(0), dtype=np.int64)
    row = int(np.searchsorted(np.cumsum(lengths), position, side="right"))
    raise PreprocessError(
        f"{description}: token id {bad} (row {row}) is outside the tokenizer's vocabulary "
        f"(vocab_size={vocab_size}, tokenizer {tokenizer!r}); the model's embedding would fail on it. "
        f"Use the tokenizer that produced these ids, or fix the preprocess function / the pre-tokenized data."
    )
