"""The stream contract every train-side dataset follows (``TuneIterableDataset``).

A stream is an *infinite*, *stateful* ``torch.utils.data.IterableDataset``:

* ``__iter__`` continues from the object's current state (a fresh object starts at the
  beginning; an object that had ``load_state_dict`` called starts where the state says) and
  never ends unless the stream was built finite on purpose.
* ``state_dict()`` returns ``{dataset_name: {...}}``: plain ints/floats/strings/bools/lists/
  dicts only (JSON-serialisable; it must load with ``torch.load(weights_only=True)``), holding
  positions and document references, never token ids, O(1) in how far the
  stream has gone, and it must describe the position *after the last sample yielded*. It must
  return fresh containers: the caller may keep them while iteration continues.
* ``load_state_dict(state)`` takes exactly what ``state_dict()`` returned.

Samples are dicts. A *document* sample (what sources and the interleaver yield) has these keys
(their names are defined in :mod:`lightning_tune_data.keys`):

* ``input_ids``: 1-D ``np.ndarray`` of token ids (BOS/EOS already added by preprocessing);
* ``loss_mask`` (optional): 1-D bool ``np.ndarray``, ``True`` where the token is a training
  target (prompt tokens are ``False``); absent means every token is a target;
* ``source``: name of the source (the manager name) it came from;
* ``epoch``: the pass over that source the document belongs to (0-based);
* ``source_row`` (optional): the document's row in its source, so packs can be saved by reference;
* ``truncated_tokens`` (optional, default 0): tokens cut from this document because it was
  longer than ``max_seq_len``;
* ``dropped_before`` (optional, default 0): overlong documents of the same source that this
  shard dropped (``overlong="drop"``) since its previous yielded document.

Packed samples (what ``IterablePackedDataset`` yields) are described in
:mod:`lightning_tune_data.packing.packer`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import IterableDataset


class ElasticResumeUnsupported(ValueError):
    """This stream's saved state can only be restored with the layout that wrote it."""


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

    def snapshot(self) -> Callable[[], dict[str, Any]]:
        """A record of the position after the last yielded sample; calling it returns
        :meth:`state_dict`'s result for that position. The train loader takes one after every
        batch. This default records the state at once; streams that can record their position
        more cheaply override it and build the state only when called."""
        state = self.state_dict()
        return lambda: state

    @abstractmethod
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict` (the namespaced dict)."""

    # -- resuming with another layout (number of ranks or dataloader workers) ------------
    def merge_shard_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        """Merge the states of *every* shard of an old layout into what they left unread.

        The result (namespaced like :meth:`state_dict`) is layout-free: give it to
        :meth:`load_global_state` of a stream built for any number of ranks and workers, and each
        new shard takes its share of what is left. Streams that cannot do this refuse clearly.

        Args:
            states: one :meth:`state_dict` per old shard (rank x dataloader worker).
        """
        raise ElasticResumeUnsupported(
            f"Stream '{self.dataset_name}' ({type(self).__name__}) cannot resume with a different number of "
            "ranks or dataloader workers: its state cannot be split. Resume with the layout of the "
            "checkpoint, or start the data fresh (`resume_data_state: false`)."
        )

    def load_global_state(self, global_state: dict[str, Any]) -> None:
        """Continue from :meth:`merge_shard_states`'s result; each shard takes its share on first use."""
        raise ElasticResumeUnsupported(
            f"Stream '{self.dataset_name}' ({type(self).__name__}) cannot resume with a different number of "
            "ranks or dataloader workers."
        )

    def load_shard_states(self, states: list[dict[str, Any]]) -> None:
        """Resume from every old shard's state under this stream's (possibly different) layout."""
        self.load_global_state(self.merge_shard_states(states))

    def read_document(self, source: str, row: int, epoch: int) -> dict[str, Any] | None:
        """Re-read document ``row`` of ``source`` as it was yielded in pass ``epoch``.

        Lets packers save documents by reference instead of by tokens. ``None``: this stream
        cannot re-read it (the packer then keeps the tokens in its state).
        """
        return None

    def _own_state(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Return this stream's entry of a namespaced state dict, or raise a clear error."""
        if self.dataset_name not in state_dict:
            raise KeyError(
                f"State for stream '{self.dataset_name}' not found; the state holds "
                f"{sorted(state_dict)}. Was the checkpoint written with a different data config?"
            )
        return state_dict[self.dataset_name]
