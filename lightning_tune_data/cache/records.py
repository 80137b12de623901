"""What a source's cache records about itself, and what that lets us say.

Each finished cache stores, in its completion marker, the inputs it was built from: the source
name, the package version and the fingerprint parts (data-file identities, preprocessing,
tokenizer, ...). From them:

* a build says which input changed since the previous build of the same source;
* ``lightning-tune-data cache list`` tells which caches are stale (their data files changed).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning_tune_data.cache.checksums import CHECKSUM_ALGORITHM, file_identity
from lightning_tune_data.cache.fingerprints import canonical_json
from lightning_tune_data.cache.marker import COMPLETE_MARKER, read_cache_metadata
from lightning_tune_data.cache.sizes import human_size, tree_size

__all__ = ["changed_data_file", "describe_changes", "previous_build", "rebuild_reason", "recorded_data_files"]


def previous_build(cache_root: str | os.PathLike[str], source_key: str, exclude: Path) -> dict[str, Any] | None:
    """The marker (plus ``"path"``) of the newest other complete cache built for ``source_key``.

    Args:
        cache_root: The cache root.
        source_key: The source's folder-safe name recorded with each build.
        exclude: The cache folder being built (not a previous build).
    """
    root = Path(cache_root)
    newest: tuple[float, dict[str, Any]] | None = None
    for marker_path in root.glob(f"*/{COMPLETE_MARKER}"):
        if marker_path.parent == exclude:
            continue
        content = read_cache_metadata(marker_path.parent)
        if not content or (content.get("inputs") or {}).get("source_key") != source_key:
            continue
        stamp = marker_path.stat().st_mtime
        if newest is None or stamp > newest[0]:
            newest = (stamp, {**content, "path": marker_path.parent})
    return None if newest is None else newest[1]


def recorded_data_files(parts: Mapping[str, Any]) -> dict[str, Any]:
    """The identities of the data files a build recorded in its fingerprint parts, by path.

    Args:
        parts: The fingerprint parts a build recorded.
    """
    source = parts.get("source") or {}
    files = {entry["path"]: entry for entry in source.get("data_file_identities") or [] if isinstance(entry, dict)}
    for entry in source.get("local_folder") or []:
        if isinstance(entry, dict):
            files[entry["path"]] = entry
    return files


def describe_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """Which inputs differ between two recorded builds (``{"package_version", "parts"}``), in words.

    Args:
        old: The inputs of the earlier build.
        new: The inputs of this build.
    """
    changes: list[str] = []
    if old.get("package_version") != new.get("package_version"):
        changes.append(f"the package version changed ({old.get('package_version')} -> {new.get('package_version')})")
    old_parts, new_parts = old.get("parts") or {}, new.get("parts") or {}
    old_files, new_files = recorded_data_files(old_parts), recorded_data_files(new_parts)
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
        if canonical_json(old_pre.get(key)) != canonical_json(new_pre.get(key)):
            if key == "function":
                changes.append("the preprocess function's code changed")
            else:
                name = "preprocess_kwargs" if key == "kwargs" else key
                changes.append(f"{name} changed ({old_pre.get(key)!r} -> {new_pre.get(key)!r})")
    skip = {"data_file_identities", "local_folder"}
    old_src, new_src = old_parts.get("source") or {}, new_parts.get("source") or {}
    for key in sorted((set(old_src) | set(new_src)) - skip):
        if canonical_json(old_src.get(key)) != canonical_json(new_src.get(key)):
            changes.append(f"{key} changed ({old_src.get(key)!r} -> {new_src.get(key)!r})")
    return changes or ["its inputs differ from the previous build"]


def rebuild_reason(cache_root: str | os.PathLike[str], inputs: Mapping[str, Any], final_dir: Path) -> str:
    """Why a build of this source is needed, compared with its newest earlier build.

    Args:
        cache_root: The cache root.
        inputs: The inputs of this build (``source_key``, ``package_version``, ``parts``).
        final_dir: The cache folder being built.
    """
    previous = previous_build(cache_root, inputs["source_key"], exclude=final_dir)
    if previous is None:
        return "no earlier build of this source"
    old_inputs = previous.get("inputs") or {}
    old_files = recorded_data_files(old_inputs.get("parts") or {})
    new_files = recorded_data_files(inputs.get("parts") or {})
    if old_files and new_files and not set(old_files) & set(new_files):
        return "no earlier build of this source"  # another source of the same name (e.g. train and val 'lm')
    size = human_size(tree_size(previous["path"]))
    return (f"{'; '.join(describe_changes(old_inputs, inputs))} since the build in {previous['path'].name} "
            f"({size}, kept; 'lightning-tune-data cache clean --cache-dir {cache_root} --store "
            f"{previous['path'].name}' removes it)")


def changed_data_file(parts: Mapping[str, Any], memo_dir: str | os.PathLike[str]) -> str | None:
    """Which data file a build read has changed or gone since (``None``: all are as recorded).

    Args:
        parts: The fingerprint parts the build recorded.
        memo_dir: The cache root, where content hashes of data files are remembered.
    """
    for entry in recorded_data_files(parts).values():
        path = entry.get("path")
        if not path or not os.path.isfile(path):
            return f"data file {path} is gone"
        if CHECKSUM_ALGORITHM not in entry:
            continue
        if file_identity(path, memo_dir=memo_dir)[CHECKSUM_ALGORITHM] != entry[CHECKSUM_ALGORITHM]:
            return f"data file {os.path.basename(path)} changed since the build"
    return None
