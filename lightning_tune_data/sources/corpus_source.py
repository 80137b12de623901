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

__all__ = ["CorpusSource"]

_FILES = "files"
#: Up to this many files, the state lists each one's identity (so a change names the file).
_LISTED_FILES = 64


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
        identity = corpus.identity()
        self._location = corpus.location
        digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:32]
        self._files: dict[str, Any] = {"digest": digest, "count": len(identity)}
        if len(identity) <= _LISTED_FILES:
            self._files["identity"] = identity

    def _with_files(self, state: dict[str, Any]) -> dict[str, Any]:
        own = state[self.dataset_name]
        own[_FILES] = self._files
        return state

    def _check_files(self, own: dict[str, Any]) -> None:
        saved = own.get(_FILES)
        if saved is None or saved["digest"] == self._files["digest"]:
            return
        now = {item["url"]: item for item in self._files.get("identity", [])}
        then = {item["url"]: item for item in saved.get("identity", [])}
        changed = sorted(url for url in set(now) | set(then) if now.get(url) != then.get(url))
        named = f": {changed[:5]}" if changed else f" ({saved['count']} files then, {self._files['count']} now)"
        raise ValueError(
            f"Source '{self.dataset_name}': files of {self._location} changed since the checkpoint was written{named}; "
            "the saved position would mean other documents. Restore the files, or resume with "
            "`resume_data_state: false` to start the data from the beginning."
        )

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
