"""The children of a mixture and where the current round stands with them.

A round of a mixture runs until its stopping strategy ends it: ``"infinite"`` (children are
expected to be infinite; one that ends is restarted with a warning), ``"first_exhausted"`` (the
round ends at the first child found exhausted), ``"all_exhausted"`` (exhausted children leave the
round, the rest share it by their weights, the round ends when none is left: every document of
every child exactly once, *not* the ``datasets`` library's oversampling meaning).
:class:`ChildStreams` holds the children, their exhausted flags and the finished flag, and saves,
restores and merges the children's own states by name.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterator
from typing import Any

from lightning_tune_data.keys import StoppingStrategy
from lightning_tune_data.sources.base import ElasticResumeUnsupported, TuneIterableDataset

__all__ = ["ChildStreams", "unique_names", "EXHAUSTED_KEY", "FINISHED_KEY", "CHILDREN_KEY"]

logger = logging.getLogger(__name__)

# State keys (entries of the mixture's state).
EXHAUSTED_KEY = "exhausted"
FINISHED_KEY = "finished"
CHILDREN_KEY = "children"

_END = object()  # what ``next`` returns for an ended child


def unique_names(mixture_name: str, datasets: list[TuneIterableDataset]) -> list[str]:
    """The children's names, refused when two are the same (names key the state and the metrics).

    Args:
        mixture_name: name of the mixture, for the message.
        datasets: the child streams.
    """
    names = [ds.dataset_name for ds in datasets]
    duplicates = sorted(n for n, c in collections.Counter(names).items() if c > 1)
    if duplicates:
        raise ValueError(
            f"InterleavedDataset '{mixture_name}': duplicate child dataset names {duplicates} "
            f"(all names: {names}). Give every child a unique dataset_name; names key the "
            "saved state and the per-source metrics."
        )
    return names


class ChildStreams:
    """A mixture's children, which of them are exhausted in this round, and whether it finished.

    Args:
        mixture_name: name of the mixture, for messages.
        datasets: the child streams, in order.
        names: their names (see :func:`unique_names`).
        stopping_strategy: what a child's end means for the round.
    """

    def __init__(self, mixture_name: str, datasets: list[TuneIterableDataset], names: list[str],
                 stopping_strategy: StoppingStrategy) -> None:
        self.mixture_name = mixture_name
        self.datasets = datasets
        self.names = names
        self.stopping_strategy = stopping_strategy
        self.exhausted = [False] * len(datasets)
        self.finished = False

    def reset(self) -> None:
        """A new round: no child exhausted, not finished."""
        self.exhausted = [False] * len(self.datasets)
        self.finished = False

    def open(self) -> list[Iterator[dict[str, Any]] | None]:
        """An iterator per child still in the round (``None`` for an exhausted one)."""
        return [None if done else iter(ds) for ds, done in zip(self.datasets, self.exhausted)]

    def active(self) -> list[int]:
        """The children still in the round."""
        return [i for i, done in enumerate(self.exhausted) if not done]

    def after_end(self, index: int, iterators: list[Iterator[dict[str, Any]] | None],
                  warned: set[int]) -> dict[str, Any] | None:
        """Apply the stopping strategy to child ``index``, found ended by a draw.

        Args:
            index: the child that ended.
            iterators: the round's iterators (:meth:`open`); an ended child's is replaced.
            warned: children already warned about in this iteration (one warning each).

        Returns:
            The restarted child's first document (``"infinite"``), or ``None``: the draw yields
            nothing (the child left the round, or the round finished: see :attr:`finished`).
        """
        if self.stopping_strategy == "first_exhausted":
            self.exhausted[index] = True
            self.finished = True
            return None
        if self.stopping_strategy == "all_exhausted":
            self.exhausted[index] = True
            iterators[index] = None
            return None
        name = self.names[index]
        if index not in warned:  # once per child and iteration, not on every restart
            warned.add(index)
            logger.warning(
                "InterleavedDataset '%s': child '%s' ended although stopping_strategy="
                "'infinite' expects infinite children; restarting it.", self.mixture_name, name,
            )
        iterators[index] = iter(self.datasets[index])
        document = next(iterators[index], _END)
        if document is _END:
            raise RuntimeError(
                f"InterleavedDataset '{self.mixture_name}': child '{name}' yields nothing "
                "even after a restart; give it data, or use a finite stopping_strategy."
            )
        return document

    def blocks_supported(self) -> bool:
        """Whether every child reads blocks and never ends, in an infinite round."""
        return self.stopping_strategy == "infinite" and all(
            getattr(child, "num_passes", None) is None and callable(getattr(child, "blocks_supported", None))
            and child.blocks_supported() for child in self.datasets
        )

    def read_document(self, source: str, row: int, epoch: int) -> dict[str, Any] | None:
        """The first child's re-read of document ``row`` of ``source`` in pass ``epoch``."""
        for child in self.datasets:
            document = child.read_document(source, row, epoch)
            if document is not None:
                return document
        return None

    # -- state ---------------------------------------------------------------------------------
    def flags_state(self, exhausted: list[bool] | None) -> dict[str, bool]:
        """``exhausted`` (no child, when ``None``) by child name, as the state saves it."""
        return dict(zip(self.names, exhausted or [False] * len(self.names)))

    def check_saved(self, own: dict[str, Any]) -> None:
        """Refuse a saved mixture state that lacks one of these children."""
        missing = [n for n in self.names if n not in own[CHILDREN_KEY]]
        if missing:
            raise KeyError(
                f"InterleavedDataset '{self.mixture_name}': the saved state has no entry for "
                f"children {missing} (it holds {sorted(own[CHILDREN_KEY])}). The mixture changed since the "
                "checkpoint; restore with the same dataset names."
            )

    def load(self, own: dict[str, Any]) -> None:
        """Restore every child from a saved mixture state, and the round's flags."""
        for ds, name in zip(self.datasets, self.names):
            ds.load_state_dict({name: own[CHILDREN_KEY][name]})
        exhausted = own.get(EXHAUSTED_KEY, {})
        self.exhausted = [bool(exhausted.get(n, False)) for n in self.names]
        self.finished = bool(own.get(FINISHED_KEY, False))

    def check_elastic(self) -> None:
        """Refuse to resume a finite round with another layout: its exhausted flags cannot be split."""
        if self.stopping_strategy != "infinite":
            raise ElasticResumeUnsupported(
                f"InterleavedDataset '{self.mixture_name}': a finite stopping_strategy "
                f"({self.stopping_strategy!r}) cannot resume with a different number of ranks or dataloader "
                "workers. Resume with the checkpoint's layout, or start the data fresh (`resume_data_state: false`)."
            )

    def merge_shard_states(self, owns: list[dict[str, Any]]) -> dict[str, Any]:
        """Each child's merge of its old shards' states (``owns``: the old mixture states), by name."""
        children: dict[str, Any] = {}
        for ds, name in zip(self.datasets, self.names):
            children.update(ds.merge_shard_states([{name: own[CHILDREN_KEY][name]} for own in owns]))
        return children

    def load_global_state(self, children: dict[str, Any]) -> None:
        """Give every child its part of a merged state (each takes its share on first use)."""
        for ds in self.datasets:
            ds.load_global_state(children)
