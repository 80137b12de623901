"""``CorpusSource``: an ``ArrowSource`` over a tokenized corpus read in place, which also saves
which files it read and checks each file's ids against the vocabulary when it first reads it.

The foreign formats carry no checksums, so the identity of every file (size and ETag or
modification time, recorded when the corpus was opened) goes into the source's saved state. A
resume over files that changed since the checkpoint (or a different set of files) fails,
naming the files, instead of continuing at a position that now means other documents.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from lightning_tune_data.keys import SOURCE_ROW
from lightning_tune_data.sources.arrow import ArrowSource
from lightning_tune_data.sources.arrow_iteration import ROWS_PER_STEP
from lightning_tune_data.sources.document_block import DocumentBlock

__all__ = ["CorpusSource", "changed_files", "files_record"]

_FILES = "files"
#: Up to this many files, the state lists each one's identity (so a change names the file).
_LISTED_FILES = 64


def files_record(corpus: Any) -> dict[str, Any]:
    """What a saved position records of a corpus's files: where it is, a digest of every file's
    identity, their count, and (up to 64 files) each one's identity, so a change names the file.

    Args:
        corpus: a ``TokenCorpus`` or ``RangedCorpus`` (anything with ``identity()`` and ``location``).
    """
    identity = corpus.identity()
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]
    record: dict[str, Any] = {"location": corpus.location, "digest": digest, "count": len(identity)}
    if len(identity) <= _LISTED_FILES:
        record["identity"] = identity
    return record


def changed_files(source: str, saved: dict[str, Any] | None, now: dict[str, Any]) -> str | None:
    """The one-line error for a resume over files that changed since ``saved`` was recorded
    (``None`` when they did not, or nothing was recorded).

    Args:
        source: the source's name.
        saved: :func:`files_record` when the checkpoint was written.
        now: :func:`files_record` of the files now.
    """
    if saved is None or saved["digest"] == now["digest"]:
        return None
    current = {item["url"]: item for item in now.get("identity", [])}
    then = {item["url"]: item for item in saved.get("identity", [])}
    changed = sorted(url for url in set(current) | set(then) if current.get(url) != then.get(url))
    named = f": {changed[:5]}" if changed else f" ({saved['count']} files then, {now['count']} now)"
    return (f"Source '{source}': files of {now.get('location')} changed since the checkpoint was written{named}; the "
            "saved position would mean other documents. Restore the files, or resume with `resume_data_state: false` "
            "to start the data from the beginning.")


class CorpusSource(ArrowSource):
    """An ``ArrowSource`` over a :class:`~lightning_tune_data.formats.corpus.TokenCorpus`.

    Args:
        corpus: the corpus.
        dataset_name: the source's name.
        kwargs: the other ``ArrowSource`` arguments.
    """

    def __init__(self, corpus: Any, dataset_name: str, **kwargs: Any) -> None:
        super().__init__(corpus, dataset_name, **kwargs)
        self._corpus = corpus
        self._files = files_record(corpus)

    def _with_files(self, state: dict[str, Any]) -> dict[str, Any]:
        own = state[self.dataset_name]
        own[_FILES] = self._files
        return state

    def _check_files(self, own: dict[str, Any]) -> None:
        problem = changed_files(self.dataset_name, own.get(_FILES), self._files)
        if problem is not None:
            raise ValueError(problem)

    def read_block(self, limit: int = ROWS_PER_STEP) -> DocumentBlock | None:
        """As ``ArrowSource.read_block``; the ids of a file are checked the first time it is read."""
        block = super().read_block(limit)
        if block is not None:
            self._corpus.check_ids(np.asarray(block.rows))
        return block

    def __iter__(self) -> Iterator[dict[str, Any]]:
        corpus = self._corpus
        if corpus.id_check is None:
            yield from super().__iter__()
            return
        for sample in super().__iter__():
            corpus.check_ids(np.array([sample[SOURCE_ROW]]))
            yield sample

    def state_dict(self) -> dict[str, Any]:
        """The ``ArrowSource`` state plus the identity of the files read."""
        return self._with_files(super().state_dict())

    def snapshot(self) -> Callable[[], dict[str, Any]]:
        """As ``ArrowSource.snapshot``, with the files' identity."""
        taken = super().snapshot()
        return lambda: self._with_files(taken())

    def state_after_block(self, block: DocumentBlock, documents: int) -> dict[str, Any]:
        """As ``ArrowSource.state_after_block``, with the files' identity."""
        return self._with_files(super().state_after_block(block, documents))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a saved state after checking the files are the ones it was written over."""
        self._check_files(self._own_state(state_dict))
        super().load_state_dict(state_dict)

    def merge_shard_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        """As ``ArrowSource.merge_shard_states``, checking every state's files."""
        for state in states:
            self._check_files(self._own_state(state))
        return self._with_files(super().merge_shard_states(states))

    def load_global_state(self, global_state: dict[str, Any]) -> None:
        """As ``ArrowSource.load_global_state``, checking the files."""
        self._check_files(self._own_state(global_state))
        super().load_global_state(global_state)
