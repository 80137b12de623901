"""Weighted interleaving of named child streams: :class:`InterleavedDataset`.

The mixture is composed of three parts, each with its own state: the draw rule with its
accounts (:class:`~lightning_tune_data.mixing.schedule.DrawSchedule`), the children and the
round's flags (:class:`~lightning_tune_data.mixing.children.ChildStreams`), and, for the packer,
the block reader (:class:`~lightning_tune_data.mixing.blocks.MixedReader`). The mixture's state
is one flat dict of their entries plus the children's states by name. For plain iterables, see
:func:`~lightning_tune_data.mixing.interleave_datasets.interleave_datasets`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from lightning_tune_data.keys import INPUT_IDS, MIX_BY, STOPPING_STRATEGIES, MixBy, StoppingStrategy
from lightning_tune_data.mixing.blocks import MixedBlock, MixedReader
from lightning_tune_data.mixing.children import (
    CHILDREN_KEY, EXHAUSTED_KEY, FINISHED_KEY, ChildStreams, unique_names,
)
from lightning_tune_data.mixing.schedule import (
    CONSUMED_KEY, DRAWS_KEY, MIX_BY_KEY, WEIGHTS_KEY, check_weights,
)
from lightning_tune_data.mixing.scheduled_draws import ScheduledDraws
from lightning_tune_data.mixing.timeline import WeightTimeline
from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.base import TuneIterableDataset

__all__ = ["InterleavedDataset"]

_END = object()  # what ``next`` returns for an ended child


class InterleavedDataset(TuneIterableDataset):
    """Mix named child streams by weight into one stream.

    Sampling: every child keeps an account of what it contributed (documents and tokens). With
    ``mix_by="documents"`` a child's *lag* is ``documents_i / weight_i`` (``tokens_i / weight_i``
    with ``mix_by="tokens"``); each draw takes the child with the smallest lag plus a random
    jitter of up to ``JITTER_DRAWS`` draws' worth. A child can never fall more than that jitter
    (plus one document) behind its target, so the realised shares converge on the weights —
    within about ``(JITTER_DRAWS + 1/weight) / draws`` — while the order stays random at short
    range. With ``"tokens"`` this holds for tokens even when one source's documents are far
    longer than another's. The jitter comes from blocks of uniforms seeded by
    ``(seed, name, shard, block)``, so the state is the draw counter plus the accounts: O(1).

    Resuming with another number of ranks or workers (:meth:`merge_shard_states`) sums the old
    shards' accounts and gives each new shard an equal part of them, so what the old run owed a
    source is paid back by the new shards together. Resuming with other weights or another
    ``mix_by`` starts the accounts afresh: the new weights apply from the resume on.

    Children shard themselves (by rank and worker); the interleaver only chooses. Nesting is allowed.
    With a ``timeline`` the weights change over the stream (:mod:`~lightning_tune_data.mixing.scheduled_draws`).

    For the packer, an infinite mixture of children that read blocks (plain ``ArrowSource`` sources,
    or such mixtures) hands out many draws at once (:meth:`read_block`): the same draws as
    iteration, by reference, with the state after any of them (:meth:`state_after_block`).

    A finished finite interleaver starts a new round (draw counter, accounts and exhausted flags
    reset) on the next ``iter()``; children continue according to their own rules.

    Args:
        datasets: child streams; their ``dataset_name`` must be unique.
        weights: one non-negative finite weight per child, positive sum; normalised to sum to 1
            (a warning is logged when they did not already).
        seed: seed of the jitter (combined with the shard); required unless ``settings`` gives it.
        dataset_name: name of this stream (its state key).
        stopping_strategy: ``"infinite"``, ``"first_exhausted"`` or ``"all_exhausted"`` (what each
            means: :class:`~lightning_tune_data.mixing.children.ChildStreams`).
        rank: this process's rank (capture it in the main process; default 0).
        world_size: number of ranks (default 1).
        mix_by: ``"documents"`` (weights are shares of documents) or ``"tokens"`` (shares of
            tokens).
        settings: the run's settings, which then supply the seed, rank and world size (give those
            keywords only with the same values).
        timeline: weights over the stream (``WeightTimeline``); ``None``: the fixed ``weights``.
    """

    def __init__(
        self,
        datasets: list[TuneIterableDataset],
        weights: list[float],
        seed: int | None = None,
        dataset_name: str = "interleaved",
        stopping_strategy: StoppingStrategy = "infinite",
        rank: int | None = None,
        world_size: int | None = None,
        mix_by: MixBy = "documents",
        settings: StreamSettings | None = None,
        timeline: WeightTimeline | None = None,
    ) -> None:
        datasets = list(datasets)
        weights = list(weights)
        names = _checked_names(dataset_name, datasets, weights, stopping_strategy, mix_by)
        self.settings = _stream_settings(dataset_name, settings, seed, rank, world_size)
        self._dataset_name = dataset_name
        self._children = ChildStreams(dataset_name, datasets, names, stopping_strategy)
        self._schedule = ScheduledDraws.or_fixed(dataset_name, names, weights, mix_by, self.settings, timeline)
        self._reader: MixedReader | None = None  # the block path's children blocks (see read_block)
        self._pending: dict[str, Any] | None = None  # a merged state (load_global_state), split on first use

    @property
    def dataset_name(self) -> str:
        """This stream's name: the key of its state."""
        return self._dataset_name

    @property
    def rank(self) -> int:
        """This process's rank (from :attr:`settings`)."""
        return self.settings.rank

    @property
    def world_size(self) -> int:
        """The number of ranks (from :attr:`settings`)."""
        return self.settings.world_size

    @property
    def weights(self) -> dict[str, float]:
        """Normalised weights by child name."""
        return self._schedule.weights_state()

    @property
    def datasets(self) -> list[TuneIterableDataset]:
        """The child streams, in order."""
        return list(self._children.datasets)

    @property
    def stopping_strategy(self) -> str:
        """When a round of the mixture ends."""
        return self._children.stopping_strategy

    @property
    def mix_by(self) -> str:
        """What a weight is a share of: documents or tokens."""
        return self._schedule.mix_by

    def _new_round(self) -> None:
        self._reader = None
        self._schedule.reset()
        self._children.reset()

    def _take_pending_share(self) -> None:
        """Take this shard's part of a state merged from another layout (on first use)."""
        if self._pending is None:
            return
        pending, self._pending = self._pending, None
        self._new_round()
        self._schedule.take_share(pending)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Draw documents from the current position on, until the stopping strategy ends the round."""
        self._take_pending_share()
        children, schedule = self._children, self._schedule
        if children.finished:  # new round
            self._new_round()
        iterators = children.open()
        uniforms: list[Any] = [-1, None]
        warned: set[int] = set()
        schedule.start_counting()
        draw, count = schedule.draw, schedule.count
        exhausted_seen, candidates = None, []
        while True:
            if exhausted_seen != children.exhausted:
                active = children.active()
                if not active:
                    children.finished = True
                    return
                exhausted_seen, candidates = list(children.exhausted), schedule.candidates(active)
            idx = draw(candidates, uniforms)
            sample = next(iterators[idx], _END)
            if sample is _END:
                sample = children.after_end(idx, iterators, warned)
                if sample is None:
                    if children.finished:
                        return
                    continue
            count(idx, len(sample[INPUT_IDS]) if INPUT_IDS in sample else 0)
            yield sample

    def read_document(self, source: str, row: int, epoch: int) -> dict[str, Any] | None:
        """Re-read a document through the child that holds ``source`` (``None``: none can)."""
        return self._children.read_document(source, row, epoch)

    def state_dict(self) -> dict[str, Any]:
        """The mixture's state after the last document handed out."""
        return self.snapshot()()

    def snapshot(self) -> Callable[[], dict[str, Any]]:
        """A record of the position after the last document handed out, taken in a few
        microseconds per child; calling it returns :meth:`state_dict`'s result for that position.
        The train loader takes one after every batch and builds the state only when a checkpoint
        asks."""
        self._take_pending_share()
        schedule, streams = self._schedule, self._children
        children = [ds.snapshot() for ds in streams.datasets]
        draws, consumed = schedule.draws, [list(account) for account in schedule.consumed]
        exhausted, finished = list(streams.exhausted), streams.finished
        timing = schedule.timing_values()

        def build() -> dict[str, Any]:
            children_state: dict[str, Any] = {}
            for child in children:
                children_state.update(child())
            return self.state_from(draws, consumed, children_state, exhausted, finished, timing)

        return build

    def state_from(self, draws: int, consumed: list[list[float]], children: dict[str, Any],
                   exhausted: list[bool] | None = None, finished: bool = False,
                   timing: list[Any] | None = None) -> dict[str, Any]:
        """The state with these draws, accounts and children's states (the settings are this mixture's).

        Args:
            draws: the draw counter.
            consumed: per child, its ``[documents, tokens]`` account.
            children: the children's states, by name.
            exhausted: per child, whether it left the round (``None``: none did).
            finished: whether the round finished.
            timing: a scheduled mixture's timing record (``None``: the current one).
        """
        return {self._dataset_name: {
            DRAWS_KEY: draws,
            CONSUMED_KEY: self._schedule.accounts_state(consumed),
            EXHAUSTED_KEY: self._children.flags_state(exhausted),
            FINISHED_KEY: finished,
            WEIGHTS_KEY: self._schedule.weights_state(),
            MIX_BY_KEY: self._schedule.mix_by,
            CHILDREN_KEY: children,
            **self._schedule.state_entries(timing),
        }}

    # -- blocks of document references (the packer's fast path) ------------------------------
    def blocks_supported(self) -> bool:
        """Whether :meth:`read_block` may be used: an infinite mixture of children that read blocks
        and never end (a finite child or stopping strategy is iterated one document at a time)."""
        return self._children.blocks_supported()

    def read_block(self, limit: int) -> MixedBlock:
        """The next ``limit`` documents of the mixture, drawn exactly as iteration draws them.

        Advances past them; :meth:`state_after_block` gives the state after any of them. Only
        when :meth:`blocks_supported`.
        """
        self._take_pending_share()
        if self._reader is None:
            self._reader = MixedReader(self._dataset_name, self._children.datasets, self._schedule, self.state_from)
        return self._reader.read(limit)

    def state_after_block(self, block: MixedBlock, documents: int) -> dict[str, Any]:
        """The mixture's state right after the first ``documents`` documents of ``block``."""
        if self._reader is None:
            raise ValueError(f"InterleavedDataset '{self._dataset_name}': this block was not read by this mixture.")
        return self._reader.state_after(block, documents)

    # -- restoring ----------------------------------------------------------------------------
    def _check_saved(self, own: dict[str, Any]) -> None:
        self._children.check_saved(own)
        self._schedule.warn_if_reweighted(own)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a saved state of the same layout (other weights restart the accounts)."""
        own = self._own_state(state_dict)
        self._check_saved(own)
        self._children.load(own)
        self._pending = None
        self._schedule.load_saved(own)
        self._reader = None

    def merge_shard_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        """Sum the old shards' accounts and merge each child's shard states (see the class docstring)."""
        self._children.check_elastic()
        owns = [self._own_state(s) for s in states]
        for own in owns:
            self._check_saved(own)
        children = self._children.merge_shard_states(owns)
        return {self._dataset_name: {**self._schedule.merged(owns), CHILDREN_KEY: children}}

    def load_global_state(self, global_state: dict[str, Any]) -> None:
        """Continue from :meth:`merge_shard_states`' result; this shard takes its share on first use."""
        own = self._own_state(global_state)
        self._children.load_global_state(own[CHILDREN_KEY])
        self._pending = own
        self._reader = None


def _checked_names(dataset_name: str, datasets: list[TuneIterableDataset], weights: list[float],
                   stopping_strategy: str, mix_by: str) -> list[str]:
    """The children's names, once the mixture's arguments are known to be usable."""
    if not datasets:
        raise ValueError(f"InterleavedDataset '{dataset_name}' needs at least one child dataset.")
    if len(datasets) != len(weights):
        raise ValueError(
            f"InterleavedDataset '{dataset_name}' got {len(datasets)} datasets but {len(weights)} "
            "weights; give exactly one weight per dataset."
        )
    names = unique_names(dataset_name, datasets)
    check_weights(dataset_name, names, weights)
    if stopping_strategy not in STOPPING_STRATEGIES:
        raise ValueError(
            f"InterleavedDataset '{dataset_name}': unknown stopping_strategy "
            f"{stopping_strategy!r}; choose one of {list(STOPPING_STRATEGIES)}."
        )
    if mix_by not in MIX_BY:
        raise ValueError(f"InterleavedDataset '{dataset_name}': mix_by={mix_by!r}; choose one of {list(MIX_BY)}.")
    return names


def _stream_settings(dataset_name: str, settings: StreamSettings | None, seed: int | None, rank: int | None,
                     world_size: int | None) -> StreamSettings:
    """The mixture's settings: ``settings`` itself, or built from the seed, rank and world size."""
    given = {"seed": seed, "rank": rank, "world_size": world_size}
    if settings is not None:
        conflicts = {k: v for k, v in given.items() if v is not None and v != getattr(settings, k)}
        if conflicts:
            raise ValueError(
                f"InterleavedDataset '{dataset_name}': {conflicts} contradict settings {settings}; "
                "give the seed, rank and world size either through settings or as keywords."
            )
        return settings
    if seed is None:
        raise TypeError(f"InterleavedDataset '{dataset_name}' needs a seed (or settings that give one).")
    rank = 0 if rank is None else rank
    world_size = 1 if world_size is None else world_size
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(
            f"InterleavedDataset '{dataset_name}': need 0 <= rank < world_size, got rank={rank}, "
            f"world_size={world_size}."
        )
    return StreamSettings(seed=seed, rank=rank, world_size=world_size)
