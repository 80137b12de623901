"""Copying whole stores between a remote root and this node: download a committed store into a
verified local copy, upload a store built here, publish a task's shards.

A download fills a temporary folder beside the local copy, checks every file's size and checksum
as it arrives (a bad one is fetched once more, then named), writes the commit last and renames
the folder into place, under a file lock: a node killed mid-download leaves nothing a later run
trusts, and two processes of a node download a store once. An upload puts the shards first and
the commit last, so a reader never sees a store that is only partly there.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
import warnings
from pathlib import Path
from typing import Any

from filelock import FileLock
from tqdm.auto import tqdm

from lightning_tune_data.cache.checksums import CHECKSUM_ALGORITHM, VerifyMode, verify_files
from lightning_tune_data.cache.fingerprints import canonical_json
from lightning_tune_data.cache.layout import lock_path, temporary_prefix
from lightning_tune_data.cache.marker import COMPLETE_MARKER, read_cache_metadata
from lightning_tune_data.cache.shard_fetch import ShardCorruptError, fetch_shard, stored_checksum
from lightning_tune_data.cache.sizes import human_size
from lightning_tune_data.cache.store_files import StoreFiles
from lightning_tune_data.cache.tasks import TaskManifest, done_marker_path, task_manifest_path
from lightning_tune_data.cache.verified import record_verified

__all__ = ["StoreCorruptError", "download_store", "publish_task", "upload_store"]

log = logging.getLogger("lightning_tune_data.cache.store")


class StoreCorruptError(OSError):
    """A file of a store does not match the size or checksum its commit records."""


def _fetch_verified(files: StoreFiles, relative: str, expected: dict[str, Any], target: Path) -> None:
    """One file of the store, through the same ranged, retried, verified fetch as a node's shards."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        fetch_shard(files, relative, expected, target)
    except ShardCorruptError as error:
        raise StoreCorruptError(error.errno, str(error)) from None


def _intact_copy(local_folder: Path, content: dict[str, Any], verify_mode: VerifyMode, warn: bool = True) -> bool:
    if canonical_json(read_cache_metadata(local_folder)) != canonical_json(content):
        return False
    problem = verify_files(local_folder, content.get("files") or {}, verify_mode)
    if problem is not None and warn:
        warnings.warn(f"Removing the corrupt local copy {local_folder} ({problem}); downloading it again.",
                      stacklevel=3)
    return problem is None


def _commit_bytes(files: StoreFiles, content: dict[str, Any]) -> bytes:
    """The bytes of the store's commit: the ones read to get ``content`` when they are its (no
    second fetch; every file was checked against them), else read now (a ``content`` from
    elsewhere, e.g. an earlier preparation's, is then found to differ)."""
    data = files.fetched.get(COMPLETE_MARKER)
    try:
        if data is not None and canonical_json(json.loads(data)) == canonical_json(content):
            return data
    except ValueError:
        pass
    return files.read_bytes(COMPLETE_MARKER) or b""


def download_store(files: StoreFiles, content: dict[str, Any], local_folder: Path, description: str,
                   verify_mode: VerifyMode = "checksum") -> Path:
    """A verified local copy of the committed store ``files`` (downloaded only when missing).

    Args:
        files: The remote store.
        content: Its commit (the completion marker's content).
        local_folder: Where this node keeps the copy.
        description: Names the source in messages.
        verify_mode: How an existing copy is checked before it is reused (a corrupt copy is
            downloaded again, with a warning naming the file).

    Returns:
        ``local_folder``.

    Raises:
        StoreCorruptError: A file does not match its recorded checksum, twice.
    """
    if _intact_copy(local_folder, content, verify_mode):
        return local_folder
    local_folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock_path(local_folder))):
        if _intact_copy(local_folder, content, verify_mode, warn=False):
            return local_folder  # another process of this node downloaded it meanwhile
        for stale in local_folder.parent.glob(temporary_prefix(local_folder) + "*"):
            shutil.rmtree(stale, ignore_errors=True)
        if local_folder.exists():
            shutil.rmtree(local_folder)
        temp = local_folder.parent / f"{temporary_prefix(local_folder)}{os.getpid()}-{uuid.uuid4().hex[:12]}"
        temp.mkdir()
        recorded = content.get("files") or {}
        total = sum(int(entry.get("size", 0)) for entry in recorded.values())
        log.info("%s: downloading store %s (%s, %d files) to %s", description, files.url(), human_size(total),
                 len(recorded), local_folder)
        try:
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"Downloading {local_folder.name}",
                      leave=False) as bar:
                for relative, expected in sorted(recorded.items()):
                    _fetch_verified(files, relative, expected, temp / relative)
                    bar.update(int(expected.get("size", 0)))
            (temp / COMPLETE_MARKER).write_bytes(_commit_bytes(files, content))
            if canonical_json(read_cache_metadata(temp)) != canonical_json(content):  # the whole commit, not its metadata only
                raise StoreCorruptError(f"{files.url(COMPLETE_MARKER)} changed during the download (the store was "
                                        "prepared again meanwhile); run again.")
            os.replace(temp, local_folder)
        except BaseException:
            shutil.rmtree(temp, ignore_errors=True)
            raise
    record_verified(local_folder, recorded)
    return local_folder


def _already_uploaded(files: StoreFiles, relative: str, expected: dict[str, Any]) -> bool:
    """Whether storage holds the recorded bytes of ``relative`` (same size, same checksum)."""
    want = expected.get(CHECKSUM_ALGORITHM)
    if want is None:
        return False
    return stored_checksum(files, relative, int(expected.get("size", 0))) == want


def upload_store(local_folder: Path, files: StoreFiles, description: str) -> None:
    """Upload a complete local store: every file (one already there is kept only when its bytes
    match the recorded checksum), then the commit.

    Args:
        local_folder: A complete local store.
        files: Where it goes.
        description: Names the source in messages.
    """
    content = read_cache_metadata(local_folder) or {}
    recorded = content.get("files") or {}
    log.info("%s: uploading store to %s (%s)", description, files.url(),
             human_size(sum(int(e.get("size", 0)) for e in recorded.values())))
    with tqdm(total=sum(int(e.get("size", 0)) for e in recorded.values()), unit="B", unit_scale=True,
              desc=f"Uploading {local_folder.name}", leave=False) as bar:
        for relative, expected in sorted(recorded.items()):
            if not _already_uploaded(files, relative, expected):
                files.put(local_folder / relative, relative)
            bar.update(int(expected.get("size", 0)))
    files.put(local_folder / COMPLETE_MARKER, COMPLETE_MARKER)


def publish_task(staging: Path, files: StoreFiles, manifest: TaskManifest) -> None:
    """Move a task's output from its local staging folder into the store: shards, then the task
    manifest, then the done-marker.

    Args:
        staging: The folder the task was written in.
        files: The store.
        manifest: What the task wrote.
    """
    for shard in manifest.shards:
        files.put(staging / shard.path, shard.path, move=True)
    index, count = manifest.task_index, manifest.num_tasks
    files.put(staging / task_manifest_path(index, count), task_manifest_path(index, count), move=True)
    files.put(staging / done_marker_path(index, count), done_marker_path(index, count), move=True)
