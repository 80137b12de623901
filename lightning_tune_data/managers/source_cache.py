"""One source's token store under a cache root: found by its fingerprint, built once (by
``prepare_data``, or by the tasks of ``lightning-tune-data prepare``), opened on every rank.

A local root is used in place. A remote root (``s3://...``) holds the committed store; each node
reads a verified local copy, downloaded once (:mod:`lightning_tune_data.cache.mirror`).
Where folders are, how they are built atomically and how files are checked is
:mod:`lightning_tune_data.cache`'s business; this object asks it, for one fingerprint, and words
what it finds for the source (a missing, unfinished or corrupt store names the source and the fix).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import datasets

from lightning_tune_data.cache.cached_store import CachedStore
from lightning_tune_data.cache.checksums import VerifyMode
from lightning_tune_data.cache.layout import cache_folder, find_cache, other_caches
from lightning_tune_data.cache.local_disk import check_shard_cache_disk
from lightning_tune_data.cache.marker import COMPLETE_MARKER, is_valid_cache, marker_matches, read_cache_metadata
from lightning_tune_data.cache.mirror import download_store, upload_store
from lightning_tune_data.cache.node_cache import NODE_CACHE_FOLDER
from lightning_tune_data.cache.records import rebuild_reason
from lightning_tune_data.cache.root import CacheBudgetError, StoreRoot
from lightning_tune_data.cache.store import build_cache_atomically
from lightning_tune_data.cache.store_files import StoreFiles
from lightning_tune_data.cache.store_reader import open_store
from lightning_tune_data.cache.window_plan import plan_window
from lightning_tune_data.cache.tasks import (
    StoreNotCommittedError,
    TaskManifest,
    commit_store,
    files_section,
    store_section,
    task_manifest_path,
    task_progress,
    unfinished_tasks,
)
from lightning_tune_data.managers.errors import CacheMissingError

__all__ = ["SourceCache"]

log = logging.getLogger("lightning_tune_data.cache.store")
_DESCRIBED: set[str] = set()  # the plans of budgeted stores this process logged (once each)


def describe_single_task(folder: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The files and store sections of a store written by one task (``prepare_data``)."""
    manifest = TaskManifest.from_json(json.loads((folder / task_manifest_path(0, 1)).read_text(encoding="utf-8")))
    return files_section([manifest]), store_section([manifest])


def _opens(folder: Path) -> str | None:
    """What keeps a reused store from opening (checked when only sizes are compared: with
    checksums, a changed file is hashed and found anyway)."""
    return open_store(folder)[1]


class SourceCache:
    """The token store of one source configuration.

    Args:
        root: The cache root (``cache_dir``: a local path, a URL or a :class:`StoreRoot`).
        key: The folder-name prefix of the source's stores (its name, made folder-safe).
        fingerprint: The configuration's fingerprint.
        manager: The manager's class name (recorded in, and required of, the store's commit).
        description: Names the source in messages.
    """

    def __init__(self, root: Any, key: str, fingerprint: str, manager: str, description: str) -> None:
        self.root = StoreRoot.of(root)
        self.key = key
        self.fingerprint = fingerprint
        self.manager = manager
        self.description = description

    @property
    def metadata(self) -> dict[str, Any]:
        """What the store's commit must hold for the store to be this configuration's."""
        return {"fingerprint": self.fingerprint, "manager": self.manager}

    def folder(self) -> Path:
        """The local folder of this fingerprint's store: a complete one under any name (e.g.
        built before the source was renamed), else ``<local root>/<key>-<fingerprint[:16]>``."""
        found = find_cache(self.root.local_dir, self.fingerprint, self.metadata)
        return found if found is not None else cache_folder(self.root.local_dir, self.key, self.fingerprint)

    def files(self) -> StoreFiles:
        """The store folder on the root's filesystem (remote or local)."""
        name = self.folder().name if not self.root.is_remote else cache_folder("", self.key, self.fingerprint).name
        return StoreFiles(self.root, name)

    def committed(self, files: StoreFiles) -> dict[str, Any] | None:
        """The store's commit when it is committed for this configuration, else ``None``."""
        content = files.read_json(COMPLETE_MARKER)
        return content if marker_matches(content, self.metadata) else None

    def finish_tasks(self, files: StoreFiles, inputs: Mapping[str, Any]) -> dict[str, Any] | None:
        """Commit a store that tasks wrote completely; ``None`` when no task wrote anything.

        Raises:
            StoreNotCommittedError: Tasks wrote part of it and some have not finished.
        """
        progress = task_progress(files)
        if not progress:
            return None
        for num_tasks, done in sorted(progress.items()):
            if len(done) == num_tasks:
                return commit_store(files, num_tasks, self.fingerprint, self.metadata, inputs, self.description)
        num_tasks, done = max(progress.items(), key=lambda item: len(item[1]))
        missing = [index for index in range(num_tasks) if index not in done]
        raise StoreNotCommittedError(
            f"{self.description}: the store at {files.url()} is not committed: "
            f"{unfinished_tasks(missing, num_tasks)}. Run {'it' if len(missing) == 1 else 'them'} "
            f"(lightning-tune-data prepare --config <config> --task-index I --num-tasks {num_tasks}), or "
            f"remove the store to start over (lightning-tune-data cache clean --cache-dir {self.root.url} "
            f"--store {files.name})."
        )

    def not_built(self, where: Any) -> CacheMissingError:
        """The one-line error of a store missing where ``build_stores`` says not to build it."""
        policy = self.root.build_stores + (" (a remote cache_dir)" if self.root.build_stores == "auto" else "")
        return CacheMissingError(
            f"{self.description}: no committed store at {where}, and build_stores={policy} does not build it here. "
            f"Run lightning-tune-data prepare --config <config> with this cache_dir first (or set "
            f"build_stores: if_missing to tokenize on this node); if the store should exist, check cache_dir."
        )

    def build(self, fill: Callable[[Path], Any], inputs: Mapping[str, Any], verify_mode: VerifyMode) -> Path:
        """Reuse the committed store (after checking its files) or build it with ``fill``.

        Args:
            fill: Writes one task's store into a folder (``prepare_data``: the only task).
            inputs: What the store is built from, recorded in its commit.
            verify_mode: How a reused local store's files are checked.

        Returns:
            The local store folder (for a remote root: this node's verified copy).
        """
        if self.root.is_remote:
            return self._build_remote(fill, inputs, verify_mode)
        final_dir = self.folder()
        if not is_valid_cache(final_dir, self.metadata) and (final_dir / "tasks").is_dir():
            self.finish_tasks(StoreFiles(self.root, final_dir.name), inputs)
        if not self.root.builds_missing_stores and not is_valid_cache(final_dir, self.metadata):
            raise self.not_built(final_dir)
        return build_cache_atomically(
            final_dir, fill, self.metadata, verify=_opens if verify_mode == "size" else None,
            verify_mode=verify_mode, inputs=inputs, description=self.description,
            build_reason=lambda: rebuild_reason(self.root.local_dir, inputs, final_dir),
            describe=describe_single_task,
        )

    def _build_remote(self, fill: Callable[[Path], Any], inputs: Mapping[str, Any], verify_mode: VerifyMode) -> Path:
        files = self.files()
        content = self.committed(files) or self.finish_tasks(files, inputs)
        if content is not None:
            budgeted = self.budgeted(files, content)
            if budgeted is not None:  # read shard by shard in training: nothing to copy now
                return budgeted.cache.folder
            return download_store(files, content, self.folder(), self.description, verify_mode)
        self.root.check(writable=self.root.builds_missing_stores)  # a mistyped bucket fails before any work
        if not self.root.builds_missing_stores:
            raise self.not_built(files.url())
        local = build_cache_atomically(
            self.folder(), fill, self.metadata, verify=_opens if verify_mode == "size" else None,
            verify_mode=verify_mode, inputs=inputs, description=self.description,
            build_reason=lambda: f"the store at {files.url()} does not exist yet", describe=describe_single_task,
        )
        if self.committed(files) is None:
            upload_store(local, files, self.description)
        return local

    def budgeted(self, files: StoreFiles, content: dict[str, Any]) -> CachedStore | None:
        """The committed remote store read through this node's shard cache, when the store's shards
        exceed its share of the node's ``cache_budget`` (its shuffle window is ``shuffle_window``
        rows, or sized to that share; a resume adopts the checkpoint's); ``None`` when it is copied
        whole.

        Raises:
            CacheBudgetError: The budget cannot hold a shuffle window and the next one; or
                ``local_cache_dir`` is on a network filesystem, or its disk has less room than
                the budget.
        """
        budget, share = self.root.cache_budget, self.root.budget_share
        if not self.root.is_remote or budget is None or share is None or not (content.get("store") or {}).get("shards"):
            return None
        sizes = [int((content.get("files") or {})[shard["path"]]["size"]) for shard in content["store"]["shards"]]
        if sum(sizes) <= share:
            return None
        rows = [int(shard["rows"]) for shard in content["store"]["shards"]]
        try:
            order = plan_window(rows, sizes, int(content["store"].get("tokens") or 0), share, self.root.shuffle_window,
                                self.root.shard_bytes, self.description, self.root.budget_sharers, self.root.node_readers)
            store = CachedStore(files, content, self.root.local_dir / NODE_CACHE_FOLDER, budget, order,
                                self.description, share=share, sharers=self.root.budget_sharers)
            check_shard_cache_disk(store.cache.node_folder, budget, store.cache.node_usage(), self.description)
        except ValueError as error:
            raise CacheBudgetError(str(error)) from None
        plan = store.describe_plan()
        if plan not in _DESCRIBED:
            _DESCRIBED.add(plan)
            log.info(plan)
        return store

    def local_store(self, inputs: Mapping[str, Any] | None = None) -> Path:
        """This node's committed copy of the store (downloaded first for a remote root).

        Args:
            inputs: What the store is built from: recorded in the commit when every task of the
                store finished but none committed it (so the commit is the one a finalizer writes).

        Raises:
            CacheMissingError: There is no committed store of this configuration.
        """
        final_dir = self.folder()
        if is_valid_cache(final_dir, self.metadata):
            return final_dir
        files = self.files()
        content = self.committed(files)
        if content is None and (self.root.is_remote or (final_dir / "tasks").is_dir()):
            content = self.finish_tasks(files, inputs or {})  # commits finished tasks, names unfinished ones
        if content is None:
            others = other_caches(self.root.local_dir, self.key)
            hint = (
                f" Caches of other configurations of this source exist ({others}); the tokenizer, "
                f"preprocessing, data files or package version differ from when they were built."
                if others else ""
            )
            read = [entry.get("path") for entry in
                    ((((inputs or {}).get("parts") or {}).get("source") or {}).get("data_file_identities") or [])
                    if isinstance(entry, dict) and entry.get("path")]
            if read:
                shown = ", ".join(read[:3]) + (f", ... ({len(read)} files)" if len(read) > 3 else "")
                hint += (f" Local data files are keyed by their resolved path and their content: this configuration "
                         f"reads {shown}; the same files reached through another path (a copy, a hard link, another "
                         f"mount point) make another store.")
            raise CacheMissingError(
                f"{self.description}: no valid preprocessed cache at {files.url()}. Run "
                f"prepare_data first (TextDataModule.prepare_data / the Trainer does this on local "
                f"rank 0 before setup) or lightning-tune-data prepare, with the same tokenizer and "
                f"cache_dir.{hint}"
            )
        if self.root.is_remote:
            return download_store(files, content, final_dir, self.description)
        return final_dir

    def open(self, inputs: Mapping[str, Any] | None = None) -> datasets.Dataset | CachedStore:
        """Memory-map the committed store (this never builds it; a remote one is downloaded to
        this node first, or read through the node's shard cache under a ``cache_budget``).

        Args:
            inputs: What the store is built from (see :meth:`local_store`).

        Raises:
            CacheMissingError: There is no committed store of this configuration, or it is corrupt.
        """
        if self.root.is_remote and self.root.cache_budget is not None:
            files = self.files()
            content = self.committed(files) or self.finish_tasks(files, inputs or {})
            budgeted = None if content is None else self.budgeted(files, content)
            if budgeted is not None:
                return budgeted
        folder = self.local_store(inputs)
        dataset, problem = open_store(folder, read_cache_metadata(folder))
        if problem is not None:
            raise CacheMissingError(
                f"{self.description}: the preprocessed cache at {folder} is corrupt "
                f"({problem}). Run prepare_data again: it removes the corrupt cache with a warning "
                f"and rebuilds it."
            )
        return dataset
