"""The cache layout of earlier versions, still read: a tokenized dataset saved in a cache folder,
and the manifest that says what was written.

New caches are token stores (:mod:`lightning_tune_data.cache.shards`); a cache built by an earlier
version with the same fingerprint is opened as it is instead of being rebuilt. Such a folder holds the ``datasets`` library's ``save_to_disk`` output in
:data:`DATASET_FOLDER` and :data:`CACHE_MANIFEST`: the row count, the rows skipped as failed and
the size of every file. Opening the cache checks the files against the manifest, so a truncated,
missing or overwritten file names itself instead of failing somewhere inside ``datasets``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets

__all__ = ["CACHE_MANIFEST", "DATASET_FOLDER", "open_dataset", "save_dataset"]

#: Written into a finished cache: row count, skipped rows and the size of every file.
CACHE_MANIFEST = "_manifest.json"
#: Sub-folder of a cache that holds the saved dataset.
DATASET_FOLDER = "dataset"


def save_dataset(folder: Path, dataset: datasets.Dataset, skipped_rows: int) -> None:
    """Save ``dataset`` into ``folder`` (a build's temporary folder), then its manifest.

    Args:
        folder: The folder to fill.
        dataset: The tokenized dataset (at least one row: ``datasets`` cannot reopen an empty one).
        skipped_rows: Rows dropped because their preprocessing failed (recorded in the manifest).
    """
    num_rows = len(dataset)
    dataset.save_to_disk(str(folder / DATASET_FOLDER))
    files = {
        p.relative_to(folder).as_posix(): p.stat().st_size
        for p in sorted((folder / DATASET_FOLDER).rglob("*")) if p.is_file()
    }
    manifest = {"num_rows": num_rows, "skipped_rows": skipped_rows, "files": files}
    (folder / CACHE_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))


def open_dataset(folder: Path) -> tuple[datasets.Dataset | None, str | None]:
    """Open a finished cache and check it against its manifest.

    Catches truncated, missing or unreadable files and a changed row count; bit flips that keep
    every size are caught by the checksums of the completion marker (checked where the cache is
    reused, not here: opening runs on every rank).

    Args:
        folder: A finished cache folder.

    Returns:
        ``(dataset, None)``, or ``(None, what is wrong)``.
    """
    manifest: dict[str, Any] | None = None
    try:
        manifest = json.loads((folder / CACHE_MANIFEST).read_text())
    except FileNotFoundError:
        pass  # written by an older version: only the opening check below applies
    except (OSError, ValueError) as error:
        return None, f"{CACHE_MANIFEST} is unreadable ({error})"
    for relative, size in (manifest or {}).get("files", {}).items():
        path = folder / relative
        if not path.is_file():
            return None, f"{relative} is missing"
        if path.stat().st_size != size:
            actual = path.stat().st_size
            return None, f"{relative} has {actual} bytes, {size} were written (truncated or overwritten)"
    try:
        dataset = datasets.Dataset.load_from_disk(str(folder / DATASET_FOLDER))
    except Exception as error:  # noqa: BLE001 - any failure to open means a corrupt cache
        return None, f"the dataset does not open ({type(error).__name__}: {error})"
    if manifest is not None and len(dataset) != manifest.get("num_rows"):
        return None, f"it holds {len(dataset)} rows, {manifest.get('num_rows')} were written"
    return dataset, None
