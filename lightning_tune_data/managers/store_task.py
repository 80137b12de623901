"""One task of one source's token store: write its part (unless it is already done), publish it,
and commit the store when it was the last task to finish.

A task writes into a local staging folder first and publishes shards, then its manifest, then its
done-marker, so a task killed at any point leaves no done-marker and its rerun writes it again.
An attempt that finds, after its work, that another attempt of the task finished or that the store
was committed meanwhile discards its output: a committed store is never touched. Whichever task
finds every done-marker present commits the store; two finishing at once write the same commit.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
import warnings
from pathlib import Path
from typing import Any

import datasets
from tqdm.auto import tqdm

from lightning_tune_data.cache.owners import claim, release, remove_if_unclaimed
from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.cache.store_files import StoreFiles, store_folders
from lightning_tune_data.cache.marker import COMPLETE_MARKER
from lightning_tune_data.cache.records import describe_changes
from lightning_tune_data.cache.task_lease import TaskLease
from lightning_tune_data.cache.tasks import (
    TASK_FOLDER,
    StoreNotCommittedError,
    TaskManifest,
    commit_store,
    done_marker_path,
    finished_task,
    task_manifest_path,
    task_progress,
)
from lightning_tune_data.managers.base import SourceManager
from lightning_tune_data.managers.hub_revision import pinned_revision
from lightning_tune_data.managers.source_cache import SourceCache
from lightning_tune_data.managers.task_inputs import check_task
from lightning_tune_data.tokenizers import Tokenizer

__all__ = ["finalize_source_store", "run_store_task"]

log = logging.getLogger("lightning_tune_data.managers")


def _check_task_count(files: StoreFiles, num_tasks: int, description: str, root: StoreRoot) -> None:
    others = {count: done for count, done in task_progress(files).items() if count != num_tasks}
    if others:
        count, done = next(iter(sorted(others.items())))
        raise StoreNotCommittedError(
            f"{description}: the store at {files.url()} is being written by {count} tasks ({len(done)} finished), "
            f"not {num_tasks}: a store's task count cannot change while it is written. Run with --num-tasks "
            f"{count}, or start over after removing the store (lightning-tune-data cache clean --cache-dir "
            f"{root.url} --store {files.name})."
        )


_staging_claims: dict[Path, int] = {}  # this process's staging folders -> the descriptor holding their lock


def _staging_folder(root: StoreRoot, name: str, task_index: int, num_tasks: int) -> Path:
    """A fresh local folder for the task's output, owned by this process (it holds a lock on the
    folder while it lives); leftovers of this task's killed runs on this machine (nobody holds
    their lock, whatever container or process id they had) are removed first."""
    for folder, fd in list(_staging_claims.items()):
        if not folder.exists():  # published and removed: give up its claim
            release(fd)
            del _staging_claims[folder]
    root.local_dir.mkdir(parents=True, exist_ok=True)
    prefix = f".{name}.task-{task_index}-of-{num_tasks}.tmp-"
    for leftover in root.local_dir.glob(prefix + "*"):
        remove_if_unclaimed(leftover)
    folder = root.local_dir / f"{prefix}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    _staging_claims[folder] = claim(folder)
    return folder


def _other_partial_stores(root: StoreRoot, key: str, this: str) -> list[StoreFiles]:
    """The partly written stores of the same source (another configuration) under the root."""
    names = store_folders(root, f"{key}-*")
    others = [StoreFiles(root, name) for name in names if name != this]
    return [files for files in others if not files.exists(COMPLETE_MARKER) and task_progress(files)]


def _warn_other_partial_stores(root: StoreRoot, key: str, files: StoreFiles, inputs: dict[str, Any],
                               description: str) -> None:
    for other in _other_partial_stores(root, key, files.name):
        manifest_name = next((n for n in other.listing(TASK_FOLDER) if n.endswith(".json")), None)
        old = (other.read_json(f"{TASK_FOLDER}/{manifest_name}") or {}).get("store_inputs") if manifest_name else None
        what = "; ".join(describe_changes(old, inputs)) if old else "its configuration differs"
        warnings.warn(
            f"{description}: a partly written store of this source is at {other.url()}, but {what}, so this run "
            f"writes a new store at {files.url()}. If that is intended, remove the old one (lightning-tune-data "
            f"cache clean --cache-dir {root.url} --store {other.name}); if not, restore the old configuration and "
            f"rerun its tasks.",
            stacklevel=3,
        )


def _publish(staging: Path, files: StoreFiles, manifest: TaskManifest, cache: SourceCache) -> str | None:
    """Publish a task's output unless another attempt of it finished (or the store was committed)
    while it ran; ``None`` when published, else what happened instead.

    Duplicate attempts are common (a requeued Slurm task while the first still runs). The task
    checked at its start; this checks again after the work, before each step that writes, so a
    committed store and another attempt's finished task are never touched. Each file is written
    whole under a name of this attempt and renamed into place (one ``PUT`` on object storage).
    """
    def superseded() -> str | None:
        if cache.committed(files) is not None:
            return "store committed by another attempt while this one ran (its output discarded)"
        if finished_task(files, manifest.task_index, manifest.num_tasks, cache.fingerprint) is not None:
            return "already done by another attempt while this one ran (its output discarded)"
        return None

    index, count = manifest.task_index, manifest.num_tasks
    steps = [[shard.path for shard in manifest.shards], [task_manifest_path(index, count)],
             [done_marker_path(index, count)]]
    total = sum((staging / path).stat().st_size for paths in steps for path in paths)
    shown = files.fs is not None and datasets.is_progress_bar_enabled()  # an upload, not a local move
    with tqdm(total=total, unit="B", unit_scale=True, disable=not shown,
              desc=f"Uploading task {index} of {count} to {files.url()}") as bar:
        for paths in steps:
            why = superseded()
            if why is not None:
                return why
            for path in paths:
                size = (staging / path).stat().st_size
                files.put(staging / path, path, move=True)
                bar.update(size)
    return None


def run_store_task(manager: SourceManager, tokenizer: Tokenizer, cache_dir: str | Path | StoreRoot,
                   task_index: int, num_tasks: int) -> str:
    """Run task ``task_index`` of ``num_tasks`` of the manager's store; commit it if complete.

    Args:
        manager: The source.
        tokenizer: The tokenizer (part of the store's fingerprint).
        cache_dir: The cache root (local path, URL or :class:`StoreRoot`).
        task_index, num_tasks: The task.

    Returns:
        What happened, in a few words (``"written"``, ``"already done"``, ``"store committed before"``,
        with ``", store committed at <url>"`` when this task committed it).

    Raises:
        StoreNotCommittedError: The store is being written with another number of tasks.
    """
    check_task(task_index, num_tasks)
    root = StoreRoot.of(cache_dir)
    cache, build, inputs = manager.store_task(tokenizer, root, task_index, num_tasks)
    files = cache.files()
    if cache.committed(files) is not None:
        return "store committed before"
    _check_task_count(files, num_tasks, cache.description, root)
    repository = manager.hub_repository()
    if repository is not None:  # every task reads the commit the first one found
        revision = pinned_revision(files, repository, manager.options.load_kwargs.get("revision"), cache.description)
        cache, build, inputs = manager.store_task(tokenizer, root, task_index, num_tasks, revision)
    if not task_progress(files):
        _warn_other_partial_stores(root, cache.key, files, inputs, cache.description)
    if finished_task(files, task_index, num_tasks, cache.fingerprint) is not None:
        status = "already done"
    else:
        staging = _staging_folder(root, files.name, task_index, num_tasks)
        try:
            with TaskLease(files, task_index, num_tasks):  # the store is being written: never "stale"
                manifest = build(staging)
                discarded = _publish(staging, files, manifest, cache)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if discarded is not None:
            return discarded
        status = f"written ({sum(s.rows for s in manifest.shards):,} rows, {len(manifest.shards)} shards)"
    if len(task_progress(files).get(num_tasks, ())) == num_tasks:
        commit_store(files, num_tasks, cache.fingerprint, cache.metadata, inputs, cache.description)
        status += f", store committed at {files.url()}"  # where a training job's cache_dir finds it
    return status


def finalize_source_store(manager: SourceManager, tokenizer: Tokenizer, cache_dir: str | Path | StoreRoot) -> str:
    """Commit the manager's store if every task finished.

    Returns:
        ``"committed"`` or ``"committed before"``.

    Raises:
        StoreNotCommittedError: Tasks are missing (named), or no task wrote anything yet.
    """
    root = StoreRoot.of(cache_dir)
    cache, _, inputs = manager.store_task(tokenizer, root)
    files = cache.files()
    if cache.committed(files) is not None:
        return "committed before"
    if cache.finish_tasks(files, inputs) is None:
        raise StoreNotCommittedError(
            f"{cache.description}: no task has written the store at {files.url()} yet. Run the tasks first "
            f"(lightning-tune-data prepare --config <config> --task-index I --num-tasks N)."
        )
    return "committed"


