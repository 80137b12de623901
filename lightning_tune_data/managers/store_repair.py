"""Repairing a committed store in place: verify every file, redo only the tasks whose files fail.

A shard changed in storage after it was written (a flipped byte, a truncated upload, a deleted
object) makes the store unusable, but the other tasks' work is still good. Repair re-hashes every
file the commit lists, runs again only the tasks that wrote a bad file, checks that each rewrite
is byte for byte what the commit records (the source must not have changed), puts the rewritten
files back and writes the commit again (the same bytes). Other stores are not touched.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from lightning_tune_data.cache.checksums import CHECKSUM_ALGORITHM
from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.cache.store_files import StoreFiles
from lightning_tune_data.cache.tasks import (
    StoreNotCommittedError,
    commit_store,
    describe_tasks,
    done_marker_path,
    task_manifest_path,
    task_name,
)
from lightning_tune_data.managers.base import SourceManager
from lightning_tune_data.managers.hub_revision import SOURCE_PIN
from lightning_tune_data.tokenizers import Tokenizer

__all__ = ["bad_files", "repair_source_store"]


def bad_files(files: StoreFiles, content: dict[str, Any]) -> dict[str, str]:
    """``{path: what is wrong}`` for every file of a commit whose size or checksum differs now.

    Args:
        files: The store.
        content: Its commit.
    """
    bad = {}
    for relative, expected in sorted((content.get("files") or {}).items()):
        size = files.size(relative)
        if size is None:
            bad[relative] = "missing"
        elif size != expected.get("size"):
            bad[relative] = f"{size} bytes, {expected.get('size')} were written"
        elif files.checksum(relative) != expected.get(CHECKSUM_ALGORITHM):
            bad[relative] = "its checksum differs from the one recorded when it was written"
    return bad


def _task_of(relative: str, num_tasks: int) -> int | None:
    for index in range(num_tasks):
        name = task_name(index, num_tasks)
        if relative.startswith(f"shards/{name}/") or relative.startswith(f"tasks/{name}."):
            return index
    return None


def repair_source_store(manager: SourceManager, tokenizer: Tokenizer, cache_dir: str | Path | StoreRoot) -> str:
    """Verify every file of the manager's committed store; redo the tasks whose files fail.

    Args:
        manager: The source.
        tokenizer: Its tokenizer.
        cache_dir: The cache root.

    Returns:
        ``"intact (N files verified)"`` or ``"repaired: task 2 of 4 redone (1 file rewritten)"``.

    Raises:
        StoreNotCommittedError: There is no committed store to repair, or a redone task wrote other
            bytes than the commit records (the source changed: the store must be prepared again).
    """
    root = StoreRoot.of(cache_dir)
    cache, _, _ = manager.store_task(tokenizer, root)
    files = cache.files()
    content = cache.committed(files)
    if content is None:
        raise StoreNotCommittedError(
            f"{cache.description}: no committed store at {files.url()} to repair; run lightning-tune-data prepare "
            f"without --repair (it redoes whatever tasks have not finished).")
    bad = bad_files(files, content)
    if not bad:
        return f"intact ({len(content.get('files') or {})} files verified)"
    num_tasks = int(content["store"]["num_tasks"])
    tasks = sorted({index for index in (_task_of(path, num_tasks) for path in bad) if index is not None})
    pin = files.read_json(SOURCE_PIN) or {}
    recorded = content["files"]
    for index in tasks:
        _, build, _ = manager.store_task(tokenizer, root, index, num_tasks, pin.get("revision"))
        staging = root.local_dir / f".{files.name}.repair-{task_name(index, num_tasks)}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            manifest = build(staging)
            written = {shard.path: (shard.size, shard.checksum) for shard in manifest.shards}
            written[task_manifest_path(index, num_tasks)] = (len(manifest.encoded()), None)
            written[done_marker_path(index, num_tasks)] = (len(manifest.done_marker()), None)
            for path in [p for p in bad if _task_of(p, num_tasks) == index]:
                size, checksum = written.get(path, (None, None))
                expected = recorded[path]
                if size != expected["size"] or (checksum is not None and checksum != expected[CHECKSUM_ALGORITHM]):
                    raise StoreNotCommittedError(
                        f"{cache.description}: task {index} of {num_tasks} now writes other bytes for {path} than the "
                        f"commit of {files.url()} records: its source changed since the store was written, so it "
                        f"cannot be repaired. Remove it (lightning-tune-data cache clean --cache-dir {root.url} "
                        f"--store {files.name}) and prepare it again.")
                files.put(staging / path, path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    still = bad_files(files, content)
    if still:
        raise StoreNotCommittedError(f"{cache.description}: {files.url()} is still damaged after repair: {still}.")
    commit_store(files, num_tasks, cache.fingerprint, cache.metadata, content.get("inputs") or {}, cache.description)
    return (f"repaired: {describe_tasks(tasks, num_tasks)} of {num_tasks} redone "
            f"({len(bad)} file{'s' if len(bad) != 1 else ''} rewritten: {', '.join(sorted(bad))})")
