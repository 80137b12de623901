"""Pinning a hub dataset to one commit for every task of its store.

Tasks of one store run on other machines and at other times. A hub dataset read by its branch
(``main``) can move between them, and tasks that read different commits would lose or repeat rows.
The first task resolves the branch (or tag) to a commit and records it in the store
(``source.json``); every later task reads that commit, whatever the branch points to by then. The
commit is recorded in each task's manifest, and the store is committed only when all of them agree
(:func:`lightning_tune_data.cache.tasks.check_task_parts`).
"""

from __future__ import annotations

import os
from typing import Any

from lightning_tune_data.cache.store_files import StoreFiles
from lightning_tune_data.managers.errors import DataSourceError

__all__ = ["SOURCE_PIN", "pinned_revision", "resolve_revision"]

#: File of a store that records the hub commit its tasks read.
SOURCE_PIN = "source.json"


def resolve_revision(repo_id: str, revision: str | None, description: str) -> str | None:
    """The commit ``revision`` (default: the repository's default branch) of hub dataset ``repo_id`` points to now.

    The hub is asked at ``$HF_ENDPOINT`` (default: huggingface.co). Offline (``HF_HUB_OFFLINE=1``)
    nothing is asked and ``None`` is returned: the data comes from the local Hugging Face cache.

    Args:
        repo_id: ``owner/dataset``.
        revision: A branch, tag or commit (``load_kwargs: {revision: ...}``), or ``None``.
        description: Names the source in the error.

    Raises:
        DataSourceError: The hub cannot be asked, or does not know the dataset or the revision.
    """
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return None
    from huggingface_hub import HfApi

    try:
        info = HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None).dataset_info(repo_id, revision=revision)
    except Exception as error:  # noqa: BLE001 - requests/httpx/hub errors have no common base
        text = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise DataSourceError(
            f"{description}: cannot resolve revision {revision or 'main'!r} of hub dataset {repo_id!r} to a commit "
            f"({type(error).__name__}: {text}). Check the dataset name, load_kwargs.revision, the network and "
            f"HF_TOKEN, or set HF_HUB_OFFLINE=1 to read the local Hugging Face cache."
        ) from None
    return str(info.sha) if info.sha else None


def pinned_revision(files: StoreFiles, repo_id: str, revision: str | None, description: str) -> str | None:
    """The hub commit every task of the store ``files`` reads: the one recorded in the store,
    else ``revision`` resolved now and recorded for the tasks that follow.

    Args:
        files: The store.
        repo_id: ``owner/dataset``.
        revision: The configured branch, tag or commit (``None``: the default branch).
        description: Names the source in messages.

    Returns:
        The commit, or ``None`` offline.
    """
    recorded: Any = files.read_json(SOURCE_PIN)
    if isinstance(recorded, dict) and recorded.get("repo_id") == repo_id and recorded.get("requested") == revision:
        return recorded.get("revision")
    resolved = resolve_revision(repo_id, revision, description)
    if resolved is not None:
        files.write_json(SOURCE_PIN, {"repo_id": repo_id, "requested": revision, "revision": resolved})
    return resolved
