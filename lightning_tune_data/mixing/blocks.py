"""Blocks of a weighted mixture: many draws at once for the packer, the same documents in the same order.

An :class:`~lightning_tune_data.mixing.interleave.InterleavedDataset` whose children all read
blocks (plain, infinite ``ArrowSource`` children) hands the packer a :class:`MixedBlock`: the
next ``limit`` draws of the mixture, made exactly as one-document iteration makes them, with
each document taken from its child's current block by reference (a row reference and its
tokens' position or view, no per-document dict). A child's block outlives the mixed block that
started it: what the mixture has not drawn from it yet waits for the next draws of that child.

The mixed block records, per draw, which child it took, that child's block and position, and
that child's account after the draw. From these :meth:`MixedReader.state_after` rebuilds the
mixture's state after any number of its documents, the same state one-document iteration has
at that point, so the packer saves positions, never documents.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from lightning_tune_data.mixing.schedule import DrawSchedule
from lightning_tune_data.packing.pieces import LENGTH_AT, PieceTokens, token_arrays
from lightning_tune_data.sources.base import TuneIterableDataset

#: Documents a child reads per block.
CHILD_BLOCK = 512


class ChildCursor:
    """A child's current block, its documents' references, and how many of them were drawn."""

    __slots__ = ("block", "refs", "at")

    def __init__(self, block: Any) -> None:
        self.block = block
        self.refs = block.references()
        self.at = 0


class MixedBlock:
    """Consecutive draws of a mixture: references and tokens in draw order, plus what rebuilds
    the mixture's state after any of them.

    Args:
        refs, tokens: per draw, the document's piece reference and its tokens (a position in its
            source's flat token array, found through ``stores``, or a view).
        stores: by source name, the sources whose flat token arrays the positions index (the
            reader's, shared by its mixed blocks).
        draws_start: the mixture's draw counter before the block.
        accounts_start: per child, ``[documents, tokens]`` drawn before the block.
        children_start: per child, where it stood before the block: ``(block, position)`` or
            its saved state (a child with no block read yet).
        chosen, child_blocks, positions, accounts: per draw, the child drawn, that child's block,
            its position in the block after the draw, and its ``(documents, tokens)`` account
            after the draw.
    """

    __slots__ = ("refs", "tokens", "stores", "draws_start", "accounts_start", "children_start", "chosen",
                 "child_blocks", "positions", "accounts", "timing_start", "crossings")

    def __init__(self, stores: dict[str, Any], draws_start: int, accounts_start: list[list[float]],
                 children_start: list[Any]) -> None:
        self.refs: list[tuple] = []
        self.tokens: list[PieceTokens] = []
        self.stores = stores
        self.draws_start = draws_start
        self.accounts_start = accounts_start
        self.children_start = children_start
        self.chosen: list[int] = []
        self.child_blocks: list[Any] = []
        self.positions: list[int] = []
        self.accounts: list[tuple[float, float]] = []
        self.timing_start: list[Any] | None = None  # a scheduled mixture's timing before the block
        self.crossings: list[tuple[int, list[Any]]] = []  # (draw counter, timing) where a new quantum began

    def references(self) -> list[tuple]:
        """Each draw's piece reference, in draw order (what the packer places)."""
        return self.refs

    @property
    def input_ids(self) -> list[np.ndarray]:
        """Each draw's tokens as a zero-copy view."""
        return token_arrays(self.refs, self.tokens, self.stores)


class MixedReader:
    """The block path of one mixture: its children's current blocks and the draws made from them.

    Args:
        mixture_name: name of the mixture, for messages.
        children: the mixture's child streams, in order.
        schedule: the mixture's draw rule and accounts (the reads advance it as iteration does).
        state_from: builds the mixture's state from a draw counter, the accounts and the
            children's states.
    """

    def __init__(self, mixture_name: str, children: list[TuneIterableDataset], schedule: DrawSchedule,
                 state_from: Callable[[int, list[list[float]], dict[str, Any]], dict[str, Any]]) -> None:
        self.mixture_name = mixture_name
        self.children = children
        self.schedule = schedule
        self.state_from = state_from
        self.cursors: list[ChildCursor | None] = [None] * len(children)
        self.stores: dict[str, Any] = {}  # every child block's, shared by the mixed blocks
        schedule.start_counting()  # as iteration starts

    def _child_position(self, index: int) -> Any:
        cursor = self.cursors[index]
        if cursor is None:
            return self.children[index].state_dict()
        return cursor.block, cursor.at

    def read(self, limit: int) -> MixedBlock:
        """The next ``limit`` draws of the mixture (it advances past them, like iteration); at most the
        timeline's ``block_documents`` when it has one (weights published during the run: a short read-ahead)."""
        limit = min(limit, getattr(getattr(self.schedule, "timeline", None), "block_documents", limit))
        schedule, children, cursors = self.schedule, self.children, self.cursors
        block = MixedBlock(self.stores, schedule.draws, [list(account) for account in schedule.consumed],
                           [self._child_position(i) for i in range(len(children))])
        refs, tokens, chosen = block.refs, block.tokens, block.chosen
        block.timing_start = schedule.timing_values()
        timed = block.timing_start is not None
        if timed:
            schedule.crossings = block.crossings
        child_blocks, positions, accounts = block.child_blocks, block.positions, block.accounts
        candidates = schedule.candidates(list(range(len(children))))
        draw, count = schedule.draw, schedule.count
        uniforms: list[Any] = [-1, None]
        for _ in range(limit):
            index = draw(candidates, uniforms)
            cursor = cursors[index]
            if cursor is None or cursor.at == len(cursor.refs):
                child_block = children[index].read_block(CHILD_BLOCK)
                if child_block is None:
                    raise RuntimeError(
                        f"InterleavedDataset '{self.mixture_name}': child '{children[index].dataset_name}' "
                        "ended although it should be infinite."
                    )
                cursor = cursors[index] = ChildCursor(child_block)
                self.stores.update(child_block.stores)
            ref = cursor.refs[cursor.at]
            refs.append(ref)
            tokens.append(cursor.block.tokens[cursor.at])
            cursor.at += 1
            account = count(index, ref[LENGTH_AT])
            chosen.append(index)
            child_blocks.append(cursor.block)
            positions.append(cursor.at)
            accounts.append((account[0], account[1]))
        if timed:
            schedule.crossings = None
        return block

    def state_after(self, block: MixedBlock, documents: int) -> dict[str, Any]:
        """The mixture's state after the first ``documents`` draws of ``block``."""
        count = len(self.children)
        accounts: list[Any] = [None] * count
        children: list[Any] = [None] * count
        found = 0
        for draw in range(documents - 1, -1, -1):  # each child's last draw in the block, newest first
            index = block.chosen[draw]
            if accounts[index] is None:
                accounts[index] = list(block.accounts[draw])
                children[index] = (block.child_blocks[draw], block.positions[draw])
                found += 1
                if found == count:
                    break
        states: dict[str, Any] = {}
        for index, child in enumerate(self.children):
            if accounts[index] is None:
                accounts[index] = list(block.accounts_start[index])
                children[index] = block.children_start[index]
            position = children[index]
            states.update(child.state_after_block(*position) if isinstance(position, tuple) else position)
        timing = block.timing_start
        for counter, values in block.crossings:  # the timing in effect for the last draw taken
            if counter >= block.draws_start + documents:
                break
            timing = values
        if timing is None:
            return self.state_from(block.draws_start + documents, accounts, states)
        return self.state_from(block.draws_start + documents, accounts, states, None, False, timing)
