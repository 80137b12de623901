"""The tasks that write a store, and the commit that makes it one.

Task ``i`` of ``n`` writes its shards under ``shards/task-<i>-of-<n>/``, then its task manifest
``tasks/task-<i>-of-<n>.json`` (its shards with rows, tokens, sizes and checksums), then its
done-marker ``tasks/task-<i>-of-<n>.done`` (the manifest's checksum). A task without a valid
done-marker is unfinished, whatever else it left: a rerun writes it again.

The store is committed when every task is done: the task manifests are merged into the store's
completion marker (:data:`~lightning_tune_data.cache.marker.COMPLETE_MARKER`), written last. Its
bytes depend only on the tasks' content, so two finalizers racing write the same commit.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import xxhash

from lightning_tune_data.cache.checksums import CHECKSUM_ALGORITHM
from lightning_tune_data.cache.fingerprints import json_default
from lightning_tune_data.cache.marker import COMPLETE_MARKER, marker_content
from lightning_tune_data.cache.shards import ShardRecord, write_shards
from lightning_tune_data.cache.store_files import StoreFiles

__all__ = [
    "STORE_FORMAT",
    "TASK_FOLDER",
    "StoreNotCommittedError",
    "TaskManifest",
    "check_task_parts",
    "commit_store",
    "describe_tasks",
    "done_marker_path",
    "files_section",
    "finished_task",
    "store_section",
    "task_manifest_path",
    "task_name",
    "task_progress",
    "unfinished_tasks",
    "write_task",
]

#: Version of the store layout (shards + task manifests + commit), recorded in every commit.
STORE_FORMAT = 1
#: Folder of a store that holds the task manifests and done-markers.
TASK_FOLDER = "tasks"
_TASK_NAME = re.compile(r"^task-(\d+)-of-(\d+)\.(json|done)$")


class StoreNotCommittedError(RuntimeError):
    """A store is not committed yet (some tasks have not finished), or its tasks disagree."""


def task_name(task_index: int, num_tasks: int) -> str:
    """``task-00003-of-00008``: the name of task ``task_index`` of ``num_tasks``."""
    return f"task-{task_index:05d}-of-{num_tasks:05d}"


def task_manifest_path(task_index: int, num_tasks: int) -> str:
    """The task manifest's path inside the store."""
    return f"{TASK_FOLDER}/{task_name(task_index, num_tasks)}.json"


def done_marker_path(task_index: int, num_tasks: int) -> str:
    """The task's done-marker path inside the store."""
    return f"{TASK_FOLDER}/{task_name(task_index, num_tasks)}.done"


def _digest(data: bytes) -> str:
    return xxhash.xxh3_128(data).hexdigest()


@dataclass
class TaskManifest:
    """What one task wrote.

    Attributes:
        fingerprint: The store's fingerprint (every task of a store must agree).
        task_index, num_tasks: Which task this is.
        inputs: Which part of the source's inputs the task read (files or a row range).
        columns: The token columns written.
        rows_read: Rows the task read before preprocessing.
        skipped_rows: Rows dropped because their preprocessing failed.
        shards: The shards written, in row order.
        store_inputs: What the whole store is built from (source, fingerprint parts), so a later
            run with another configuration can say what changed.
    """

    fingerprint: str
    task_index: int
    num_tasks: int
    inputs: dict[str, Any]
    columns: list[str]
    rows_read: int
    skipped_rows: int
    shards: list[ShardRecord] = field(default_factory=list)
    store_inputs: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The manifest as written to ``tasks/<task>.json``."""
        return {"store_format": STORE_FORMAT, "fingerprint": self.fingerprint, "task_index": self.task_index,
                "num_tasks": self.num_tasks, "inputs": self.inputs, "columns": self.columns,
                "rows_read": self.rows_read, "skipped_rows": self.skipped_rows,
                "shards": [shard.as_json() for shard in self.shards], "store_inputs": self.store_inputs}

    @classmethod
    def from_json(cls, content: Mapping[str, Any]) -> TaskManifest:
        """Read a manifest written by :meth:`as_json`."""
        return cls(content["fingerprint"], int(content["task_index"]), int(content["num_tasks"]),
                   dict(content.get("inputs") or {}), list(content["columns"]), int(content["rows_read"]),
                   int(content["skipped_rows"]), [ShardRecord.from_json(s) for s in content["shards"]],
                   dict(content.get("store_inputs") or {}))

    def encoded(self) -> bytes:
        """The manifest's bytes (canonical JSON)."""
        return json.dumps(self.as_json(), sort_keys=True, indent=2, default=json_default).encode("utf-8")

    def done_marker(self) -> bytes:
        """The done-marker's bytes: the manifest's size and checksum."""
        data = self.encoded()
        return json.dumps({"task_manifest": {"size": len(data), CHECKSUM_ALGORITHM: _digest(data)}},
                          sort_keys=True).encode("utf-8")


def write_task(folder: Path, table: pa.Table, fingerprint: str, task_index: int, num_tasks: int,
               part: Mapping[str, Any], rows_read: int, skipped_rows: int, shard_bytes: int,
               store_inputs: Mapping[str, Any] | None = None) -> TaskManifest:
    """Write one task's output into a local folder: its shards, then its manifest, then its done-marker.

    Args:
        folder: The store folder, or the task's local staging copy of it.
        table: The task's token columns, in row order.
        fingerprint: The store's fingerprint.
        task_index, num_tasks: The task.
        part: Which part of the source's inputs the task read.
        rows_read: Rows the task read before preprocessing.
        skipped_rows: Rows dropped because their preprocessing failed.
        shard_bytes: A shard is closed once it holds about this many bytes.
        store_inputs: What the whole store is built from.

    Returns:
        The task's manifest.
    """
    shards = write_shards(table, folder, task_name(task_index, num_tasks), shard_bytes)
    manifest = TaskManifest(fingerprint, task_index, num_tasks, dict(part), list(table.column_names), rows_read,
                            skipped_rows, shards, dict(store_inputs or {}))
    (folder / TASK_FOLDER).mkdir(exist_ok=True)
    (folder / task_manifest_path(task_index, num_tasks)).write_bytes(manifest.encoded())
    (folder / done_marker_path(task_index, num_tasks)).write_bytes(manifest.done_marker())
    return manifest


def finished_task(files: StoreFiles, task_index: int, num_tasks: int, fingerprint: str,
                  check_shards: bool = True) -> TaskManifest | None:
    """The manifest of a finished task, or ``None`` when the task must be (re)done.

    A task is finished when its done-marker exists, its manifest matches the checksum the
    marker records and names this fingerprint, and (``check_shards``) every shard it lists
    exists with the recorded size.

    Args:
        files: The store folder.
        task_index, num_tasks: The task.
        fingerprint: The store's fingerprint.
        check_shards: Also check the shards' sizes (one metadata request per shard).
    """
    marker = files.read_json(done_marker_path(task_index, num_tasks))
    data = files.read_bytes(task_manifest_path(task_index, num_tasks))
    if not isinstance(marker, dict) or data is None:
        return None
    expected = marker.get("task_manifest") or {}
    if expected.get("size") != len(data) or expected.get(CHECKSUM_ALGORITHM) != _digest(data):
        return None
    try:
        manifest = TaskManifest.from_json(json.loads(data))
    except (KeyError, TypeError, ValueError):
        return None
    if manifest.fingerprint != fingerprint or (manifest.task_index, manifest.num_tasks) != (task_index, num_tasks):
        return None
    if check_shards and any(files.size(shard.path) != shard.size for shard in manifest.shards):
        return None
    return manifest


def task_progress(files: StoreFiles) -> dict[int, set[int]]:
    """``{num_tasks: {indices with a done-marker}}`` for every task count found in the store."""
    found: dict[int, set[int]] = {}
    for name in files.listing(TASK_FOLDER):
        match = _TASK_NAME.match(name)
        if match:
            done = found.setdefault(int(match.group(2)), set())
            if match.group(3) == "done":
                done.add(int(match.group(1)))
    return found


def store_section(manifests: list[TaskManifest]) -> dict[str, Any]:
    """The ``store`` part of a commit: the shards in global row order with their counts.

    Args:
        manifests: Every task's manifest, in task order.
    """
    shards = [shard for manifest in manifests for shard in manifest.shards]
    return {
        "format": STORE_FORMAT,
        "num_tasks": len(manifests),
        "columns": manifests[0].columns if manifests else [],
        "rows": sum(s.rows for s in shards),
        "tokens": sum(s.tokens for s in shards),
        "skipped_rows": sum(m.skipped_rows for m in manifests),
        "shards": [{"path": s.path, "rows": s.rows, "tokens": s.tokens} for s in shards],
    }


def files_section(manifests: list[TaskManifest]) -> dict[str, dict[str, Any]]:
    files: dict[str, dict[str, Any]] = {}
    for manifest in manifests:
        for shard in manifest.shards:
            files[shard.path] = {"size": shard.size, CHECKSUM_ALGORITHM: shard.checksum}
        data = manifest.encoded()
        files[task_manifest_path(manifest.task_index, manifest.num_tasks)] = {
            "size": len(data), CHECKSUM_ALGORITHM: _digest(data)}
        done = manifest.done_marker()
        files[done_marker_path(manifest.task_index, manifest.num_tasks)] = {
            "size": len(done), CHECKSUM_ALGORITHM: _digest(done)}
    return files


def commit_store(files: StoreFiles, num_tasks: int, fingerprint: str, metadata: Mapping[str, Any],
                 inputs: Mapping[str, Any], description: str) -> dict[str, Any]:
    """Check that every task finished and agrees, then write the commit (the completion marker).

    Args:
        files: The store folder.
        num_tasks: How many tasks wrote it.
        fingerprint: The store's fingerprint.
        metadata, inputs, description: As recorded in every completion marker.

    Returns:
        The commit's content.

    Raises:
        StoreNotCommittedError: Some tasks have not finished, their columns differ, or the store
            holds no rows at all.
    """
    manifests = [finished_task(files, index, num_tasks, fingerprint) for index in range(num_tasks)]
    missing = [index for index, manifest in enumerate(manifests) if manifest is None]
    if missing:
        raise StoreNotCommittedError(
            f"{description}: cannot commit the store at {files.url()}: {unfinished_tasks(missing, num_tasks)} (no "
            f"valid done-marker, or a shard is missing). Run {'it' if len(missing) == 1 else 'them'} "
            f"(lightning-tune-data prepare --task-index I --num-tasks {num_tasks}), then finalize again."
        )
    done = [manifest for manifest in manifests if manifest is not None]
    columns = {tuple(manifest.columns) for manifest in done}
    if len(columns) > 1:
        raise StoreNotCommittedError(
            f"{description}: the tasks wrote different columns {sorted(columns)}: the preprocess function "
            f"returns loss_mask for some rows only. Make it return the same columns for every row."
        )
    check_task_parts(done, description, files.url())
    store = store_section(done)
    if store["rows"] == 0:
        raise StoreNotCommittedError(
            f"{description}: no rows left after preprocessing ({sum(m.rows_read for m in done)} rows read, "
            f"{store['skipped_rows']} skipped as failed). Check the data files and the preprocess function."
        )
    content = marker_content(metadata, inputs, description, files_section(done), store)
    files.write_json(COMPLETE_MARKER, content)
    return content


def _ranges_problem(spans: list[tuple[int, int, int]], total: int, what: str) -> str | None:
    """What is wrong with ``(task, start, end)`` spans (in task order) as one cover of ``[0, total)``."""
    position = 0
    for index, start, end in spans:
        if start != position:
            kind = "overlaps the task before it" if start < position else "leaves a gap after the task before it"
            return f"task {index} read {what} [{start}, {end}), which {kind} (that one ended at {position})"
        position = end
    if position != total:
        return f"the tasks read {what} [0, {position}) of {total}"
    return None


def check_task_parts(manifests: list[TaskManifest], description: str, url: str) -> None:
    """Check that the tasks of a store read one and the same source, each part exactly once.

    Every task must have seen the same hub revision, and the tasks' parts must cover the source
    exactly once: file runs ``[0, files)`` or row ranges ``[0, rows)`` of one and the same row
    count (a source that changed between tasks, on other machines or at other times, would
    otherwise lose or repeat rows silently).

    Args:
        manifests: Every task's manifest, in task order.
        description: Names the source in the error.
        url: The store, named in the error.

    Raises:
        StoreNotCommittedError: Naming the tasks that disagree and how to start over.
    """
    fix = (f"The source changed while its tasks ran. Pin it (load_kwargs: {{revision: <commit>}} for a hub "
           f"dataset; leave the data files unchanged), remove the store at {url} and prepare it again.")
    revisions: dict[str, list[int]] = {}
    for manifest in manifests:
        revisions.setdefault(str(manifest.inputs.get("revision")), []).append(manifest.task_index)
    if len(revisions) > 1:
        seen = "; ".join(f"{describe_tasks(tasks, len(manifests))}: {revision}" for revision, tasks in revisions.items())
        raise StoreNotCommittedError(f"{description}: the tasks read different revisions of the source ({seen}). {fix}")
    problem = None
    if len(manifests) > 1 and all("rows" in m.inputs for m in manifests):
        totals = sorted({int(m.inputs.get("of_rows", -1)) for m in manifests})
        if len(totals) > 1:
            problem = f"the tasks saw different row counts of the source ({', '.join(map(str, totals))})"
        else:
            spans = [(m.task_index, *map(int, m.inputs["rows"])) for m in manifests]
            problem = _ranges_problem(spans, totals[0], "rows")
    elif len(manifests) > 1 and all("file_range" in m.inputs for m in manifests):
        totals = sorted({int(m.inputs.get("of_files", -1)) for m in manifests})
        if len(totals) > 1:
            problem = f"the tasks saw different numbers of data files ({', '.join(map(str, totals))})"
        else:
            spans = [(m.task_index, *map(int, m.inputs["file_range"])) for m in manifests]
            problem = _ranges_problem(spans, totals[0], "files")
    elif len(manifests) > 1 and len({"rows" if "rows" in m.inputs else "file_range" in m.inputs
                                     for m in manifests}) > 1:
        problem = "some tasks split the source by whole files, others by rows"
    if problem is not None:
        raise StoreNotCommittedError(f"{description}: cannot commit the store at {url}: {problem}. {fix}")


def unfinished_tasks(indices: list[int], num_tasks: int) -> str:
    """``task 2 of 4 has not finished`` / ``tasks 1, 3 of 4 have not finished``, for messages."""
    return f"{describe_tasks(indices, num_tasks)} of {num_tasks} {'has' if len(indices) == 1 else 'have'} not finished"


def describe_tasks(indices: list[int], num_tasks: int) -> str:
    """``tasks 1, 3`` (or ``task 2``; long lists shortened) for messages."""
    shown = ", ".join(str(i) for i in indices[:12]) + (f", ... ({len(indices)} in all)" if len(indices) > 12 else "")
    return f"task{'s' if len(indices) != 1 else ''} {shown}"
