"""The interface of a packing strategy, and the registry of strategies by name.

A strategy decides where each document goes among the packs being filled. Adding one is one
class in one module: subclass :class:`PackingStrategy`, give it a :attr:`~PackingStrategy.name`,
implement :meth:`~PackingStrategy.add`, and decorate it with :func:`register_strategy`; the packer
(``IterablePackedDataset(strategy=name)``) and the datamodule's ``packing`` option then accept
its name.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from lightning_tune_data.packing.pack import Pack
from lightning_tune_data.packing.pieces import PieceExtra, PieceTokens, Reference

if TYPE_CHECKING:
    from lightning_tune_data.packing.document_queue import DocumentQueue
    from lightning_tune_data.packing.placement import PackPlacer

__all__ = ["STRATEGY", "PackingStrategy", "get_strategy", "register_strategy", "strategy_names"]

#: Key of the strategy's name in a packer's saved state.
STRATEGY = "strategy"

_REGISTRY: dict[str, type[PackingStrategy]] = {}


class PackingStrategy(abc.ABC):
    """Where documents go: the open packs of one strategy and its placement loops.

    A strategy owns the packs being filled (:attr:`open`, by creation number, oldest first) and
    any index it keeps over them; a pack it finishes goes to the placer's :attr:`ready` queue.
    The placer applies the overlong policy before :meth:`add` (a strategy that
    :attr:`splits_documents` gets every document whole and cuts it at ``max_seq_len`` itself).

    A subclass sets :attr:`name` and implements :meth:`add`; it overrides :meth:`place_block`
    for a faster loop over a plain block (every document a whole, re-readable one), and
    :meth:`set_open` when it keeps an index over its open packs.

    Args:
        placer: the placer it places for: its ``max_seq_len``, ``ready`` queue and ``stores``.
    """

    #: The name a packer's ``strategy`` argument and a saved state use.
    name: ClassVar[str]
    #: Whether it cuts documents longer than ``max_seq_len`` itself (then no document is overlong for it).
    splits_documents: ClassVar[bool] = False

    def __init__(self, placer: PackPlacer) -> None:
        self.placer = placer
        # The placer's settings and shared containers, held here so placement reads them in one step.
        self.max_seq_len = placer.max_seq_len
        self.ready = placer.ready
        self.stores = placer.stores
        self.open: dict[int, Pack] = {}
        self.next_number = 0  # creation number of the next open pack

    def open_pack(self, pack: Pack) -> int:
        """Add ``pack`` to the open packs; returns its creation number."""
        number = self.next_number
        self.next_number += 1
        self.open[number] = pack
        return number

    def set_open(self, packs: list[Pack]) -> None:
        """Replace the open packs (oldest first): a resumed state's, or none.

        Args:
            packs: the new open packs, oldest first.
        """
        self.open.clear()
        self.next_number = 0
        for pack in packs:
            pack.stores = self.stores
            self.open_pack(pack)

    @abc.abstractmethod
    def add(self, ref: Reference, tokens: PieceTokens, extra: PieceExtra | None) -> None:
        """Place one piece, after the overlong policy: into an open pack, or a new one.

        A pack that becomes full, or that the strategy closes, is appended to :attr:`ready`.

        Args:
            ref: the piece's reference.
            tokens: its tokens (a position in its source's flat token array, or a view).
            extra: its extra, if any.
        """

    def place_each(self, queue: DocumentQueue, until_ready: int) -> int:
        """Place ``queue``'s documents one at a time through the placer (which applies the
        overlong policy) until :attr:`ready` holds ``until_ready`` packs or the queue is empty;
        returns how many documents were placed.

        Args:
            queue: the documents to place, from ``queue.at`` on (moved past the placed ones).
            until_ready: finished packs to stop at.
        """
        start, refs, tokens, extras, ready, place = (queue.at, queue.refs, queue.tokens, queue.extras, self.ready,
                                                     self.placer.place)
        while queue.at < len(refs) and len(ready) < until_ready:
            at = queue.at
            queue.at += 1
            place(refs[at], tokens[at], None if extras is None else extras[at])
        return queue.at - start

    #: The loop over a plain queue (no extras), same contract as :meth:`place_each` (which it is
    #: unless a strategy has a faster one). A document finishes at most one pack unless the
    #: strategy splits documents, so such a loop stops right after the document that finished
    #: the last pack asked for.
    place_block = place_each

    def state(self) -> dict[str, Any]:
        """What the strategy writes into a packer's saved state: its name (a state loads only into
        the strategy that wrote it). Its open packs are saved by the packer, oldest first, and
        come back through :meth:`set_open`, from which it rebuilds any index it keeps."""
        return {STRATEGY: self.name}


StrategyClass = TypeVar("StrategyClass", bound=type[PackingStrategy])


def register_strategy(cls: StrategyClass) -> StrategyClass:
    """Register a strategy class under its ``name`` (use it as a class decorator).

    Args:
        cls: a :class:`PackingStrategy` subclass with a unique, non-empty ``name``.

    Raises:
        TypeError: ``cls`` is not a :class:`PackingStrategy` subclass.
        ValueError: its name is empty, or another class is registered under it.
    """
    if not (isinstance(cls, type) and issubclass(cls, PackingStrategy)):
        raise TypeError(f"register_strategy takes a PackingStrategy subclass, got {cls!r}.")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise ValueError(f"Packing strategy {cls.__qualname__} needs a non-empty string `name`, got {name!r}.")
    registered = _REGISTRY.get(name, cls)
    if registered is not cls:
        raise ValueError(f"A packing strategy named {name!r} is registered already ({registered.__qualname__}).")
    _REGISTRY[name] = cls
    return cls


def get_strategy(name: str) -> type[PackingStrategy]:
    """The strategy class registered under ``name``.

    Args:
        name: a registered strategy's name.

    Raises:
        ValueError: no strategy has that name (the message lists the names).
    """
    strategy = _REGISTRY.get(name) if isinstance(name, str) else None
    if strategy is None:
        raise ValueError(f"Unknown packing strategy {name!r}; choose one of {list(strategy_names())}.")
    return strategy


def strategy_names() -> tuple[str, ...]:
    """The registered strategies' names, in the order they were registered."""
    return tuple(_REGISTRY)
