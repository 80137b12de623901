"""Every rank trains on the files rank 0 opened: the tokenized corpora's identities, compared once.

A tokenized corpus read in place records each file's size and identity (ETag or modification
time) when a rank opens it, and a remote file is copied to each node under that identity. A file
replaced while a run starts (after one node copied it, before another did) would give two nodes
different bytes under one data signature. At ``setup`` every rank compares the identities it
recorded with rank 0's (one broadcast of rank 0's records; the checkpoint's data signature holds
the same records) and fails naming the file, instead of training on different data.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from lightning_tune_data.distributed import current_rank_and_world_size
from lightning_tune_data.formats.files import STABLE_COPY_FIX
from lightning_tune_data.managers.errors import DataSourceError

__all__ = ["check_files_agree", "corpus_identities", "disagreeing_files"]


def corpus_identities(datasets: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Every tokenized corpus's file identities (``{"url", "size", "stamp"}`` per file) by source name.

    Args:
        datasets: the train datasets by source name (those without ``identity()`` are left out).
    """
    return {name: data.identity() for name, data in datasets.items() if hasattr(data, "identity")}


def disagreeing_files(source: str, own: list[dict[str, Any]], reference: list[dict[str, Any]],
                      rank: int = 1) -> str | None:
    """The one-line error when ``own`` (this rank's identities) differ from ``reference`` (rank 0's);
    ``None`` when they agree.

    Args:
        source: the source's name.
        own: the identities this rank recorded.
        reference: the identities rank 0 recorded.
        rank: this rank (for the message).
    """
    if own == reference:
        return None
    mine = {item["url"]: item for item in own}
    theirs = {item["url"]: item for item in reference}
    changed = sorted(url for url in set(mine) | set(theirs) if mine.get(url) != theirs.get(url))

    def said(item: dict[str, Any] | None) -> str:
        return "absent" if item is None else f"{item['size']} bytes, identity {item['stamp']}"

    first = changed[0]
    more = f" and {len(changed) - 1} more file(s)" if len(changed) > 1 else ""
    return (f"Source '{source}': {first} changed while the run started (rank 0 opened it as {said(theirs.get(first))}; "
            f"rank {rank} as {said(mine.get(first))}){more}, so the ranks would train on different bytes. Restart "
            f"the run so that every node opens the same files, or {STABLE_COPY_FIX}.")


def check_files_agree(datasets: dict[str, Any]) -> None:
    """Under DDP, fail unless this rank opened its tokenized corpora's files with the identities
    rank 0 recorded (a collective: every rank calls it after setting up its train data; nothing
    happens without a process group or tokenized corpus).

    Args:
        datasets: the train datasets by source name.

    Raises:
        DataSourceError: naming the source, the file and both identities.
    """
    rank, world_size = current_rank_and_world_size()
    if world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
        return
    own = corpus_identities(datasets)
    if not own:
        return
    holder: list[Any] = [own]
    dist.broadcast_object_list(holder, src=0)
    reference = holder[0]
    for source, identity in own.items():
        problem = disagreeing_files(source, identity, reference.get(source, []), rank)
        if problem is not None:
            raise DataSourceError(problem)
