"""The stream contract every train-side dataset follows (seed 000's ``TuneIterableDataset``).

A stream is an *infinite*, *stateful* ``torch.utils.data.IterableDataset``:

* ``__iter__`` continues from the object's current state (a fresh object starts at the
  beginning; an object that had ``load_state_dict`` called starts where the state says) and
  never ends unless the stream was built finite on purpose.
* ``state_dict()`` returns ``{dataset_name: {...}}``: plain ints/floats/strings/lists/dicts
  and tensors only (it must load with ``torch.load(weights_only=True)``), O(1) in how far the
  stream has gone, and it must describe the position *after the last sample yielded*. It must
  return fresh containers: the caller may keep them while iteration continues.
* ``load_state_dict(state)`` takes exactly what ``state_dict()`` returned.

Samples are dicts. A *document* sample (what sources and the interleaver yield) has:

* ``input_ids``: 1-D ``np.ndarray`` of token ids (BOS/EOS already added by preprocessing);
* ``loss_mask`` (optional): 1-D bool ``np.ndarray``, ``True`` where the token is a training
  target (prompt tokens are ``False``); absent means every token is a target;
* ``source``: name of the source (the manager name) it came from;
* ``epoch``: the pass over that source the document belongs to (0-based);
* ``row`` (optional): the document's row in its source, so packs can be saved by reference;
* ``truncated_tokens`` (optional, default 0): tokens cut from this document because it was
  longer than ``max_seq_len``;
* ``dropped_before`` (optional, default 0): overlong documents of the same source that this
  shard dropped (``overlong="drop"``) since its previous yielded document.

Packed samples (what ``IterablePackedDataset`` yields) are described in ``streams/packing.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

from torch.utils.data import IterableDataset

#: Keys of a document sample.
INPUT_IDS = "input_ids"
LOSS_MASK = "loss_mask"
SOURCE = "source"
EPOCH = "epoch"
ROW = "row"
TRUNCATED_TOKENS = "truncated_tokens"
DROPPED_BEFORE = "dropped_before"


class TuneIterableDataset(IterableDataset, ABC):
    """Abstract infinite, stateful, resumable stream of samples (see module docstring)."""

    @property
    @abstractmethod
    def dataset_name(self) -> str:
        """Unique name; namespaces this stream's state and metrics."""

    @abstractmethod
    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Yield samples from the current state onwards (infinitely by default)."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Return ``{dataset_name: state}`` describing the position after the last yielded sample."""

    @abstractmethod
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict` (the namespaced dict)."""

    def _own_state(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Return this stream's entry of a namespaced state dict, or raise a clear error."""
        if self.dataset_name not in state_dict:
            raise KeyError(
                f"State for stream '{self.dataset_name}' not found; the state holds "
                f"{sorted(state_dict)}. Was the checkpoint written with a different data config?"
            )
        return state_dict[self.dataset_name]
