"""One source's cache under a cache root: found by its fingerprint, built once per node, opened on
every rank.

Where the folder is, how it is built atomically and how its files are checked is
:mod:`lightning_tune_data.cache`'s business; this object asks it, for one fingerprint, and words
what it finds for the source (a missing or corrupt cache names the source and the fix).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import datasets

from lightning_tune_data.cache.checksums import VerifyMode
from lightning_tune_data.cache.layout import cache_folder, find_cache, other_caches
from lightning_tune_data.cache.marker import is_valid_cache
from lightning_tune_data.cache.records import rebuild_reason
from lightning_tune_data.cache.saved_dataset import open_dataset
from lightning_tune_data.cache.store import build_cache_atomically
from lightning_tune_data.managers.errors import CacheMissingError

__all__ = ["SourceCache"]


class SourceCache:
    """The cache of one source configuration.

    Args:
        root: The cache root (``cache_dir``).
        key: The folder-name prefix of the source's caches (its name, made folder-safe).
        fingerprint: The configuration's fingerprint.
        manager: The manager's class name (recorded in, and required of, the cache's marker).
        description: Names the source in messages.
    """

    def __init__(self, root: str | os.PathLike[str], key: str, fingerprint: str, manager: str,
                 description: str) -> None:
        self.root = root
        self.key = key
        self.fingerprint = fingerprint
        self.manager = manager
        self.description = description

    @property
    def metadata(self) -> dict[str, Any]:
        """What the cache's marker must hold for the cache to be this configuration's."""
        return {"fingerprint": self.fingerprint, "manager": self.manager}

    def folder(self) -> Path:
        """The complete cache of this fingerprint under any name (e.g. built before the source was
        renamed), else the folder a build creates: ``<root>/<key>-<fingerprint[:16]>``."""
        found = find_cache(self.root, self.fingerprint, self.metadata)
        return found if found is not None else cache_folder(self.root, self.key, self.fingerprint)

    def build(self, fill: Callable[[Path], None], inputs: Mapping[str, Any], verify_mode: VerifyMode) -> Path:
        """Reuse the complete cache (after checking its files) or build it with ``fill``.

        Args:
            fill: Fills the build's temporary folder.
            inputs: What the cache is built from, recorded in its marker.
            verify_mode: How a reused cache's files are checked: ``"checksum"`` or ``"size"``.

        Returns:
            The cache folder.
        """
        final_dir = self.folder()
        return build_cache_atomically(
            final_dir, fill, self.metadata, verify=lambda folder: open_dataset(folder)[1],
            verify_mode=verify_mode, inputs=inputs, description=self.description,
            build_reason=lambda: rebuild_reason(self.root, inputs, final_dir),
        )

    def open(self) -> datasets.Dataset:
        """Memory-map the complete cache (this never builds it).

        Raises:
            CacheMissingError: There is no complete cache of this configuration, or it is corrupt.
        """
        final_dir = self.folder()
        if not is_valid_cache(final_dir, self.metadata):
            others = other_caches(self.root, self.key)
            hint = (
                f" Caches of other configurations of this source exist ({others}); the tokenizer, "
                f"preprocessing, data files or package version differ from when they were built."
                if others
                else ""
            )
            raise CacheMissingError(
                f"{self.description}: no valid preprocessed cache at {final_dir}. Run "
                f"prepare_data first (TextDataModule.prepare_data / the Trainer does this on local "
                f"rank 0 before setup) with the same tokenizer and cache_dir.{hint}"
            )
        dataset, problem = open_dataset(final_dir)
        if problem is not None:
            raise CacheMissingError(
                f"{self.description}: the preprocessed cache at {final_dir} is corrupt "
                f"({problem}). Run prepare_data again: it removes the corrupt cache with a warning "
                f"and rebuilds it."
            )
        return dataset
