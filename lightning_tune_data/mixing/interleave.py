"""Weighted interleaving of streams.

* :class:`InterleavedDataset`: a :class:`TuneIterableDataset` that mixes named child streams by
  weight, in documents or in tokens, with an O(1), exactly and elastically resumable state.
* :func:`interleave_datasets`: a framework-agnostic generator over plain iterables (no state,
  ``random.Random`` sampling).

Stopping strategies: ``"infinite"`` (children are expected to be infinite; one that ends is
restarted with a warning), ``"first_exhausted"`` (stop at the first child found exhausted),
``"all_exhausted"`` (drop exhausted children, renormalise the rest, stop when none is left:
every sample of every child exactly once, *not* the ``datasets`` library's oversampling
meaning).
"""

from __future__ import annotations

import collections
import logging
import math
import numbers
import random
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from lightning_tune_data.distributed import current_shard
from lightning_tune_data.keys import INPUT_IDS
from lightning_tune_data.sources.base import ElasticResumeUnsupported, TuneIterableDataset
from lightning_tune_data.mixing.blocks import MixedBlock, MixedReader

__all__ = ["InterleavedDataset", "interleave_datasets", "STOPPING_STRATEGIES", "MIX_BY"]

logger = logging.getLogger(__name__)

STOPPING_STRATEGIES = ("infinite", "first_exhausted", "all_exhausted")
#: What a weight is a share of: documents drawn, or tokens drawn.
MIX_BY = ("documents", "tokens")

#: Draws per block of jitter uniforms (the generator is re-seeded per block, so the state is a counter).
BLOCK_SIZE = 256
#: How far (in draws' worth of data) the random jitter may reorder sources around their targets.
JITTER_DRAWS = 32

_END = object()  # sentinel for an exhausted iterator

# State keys.
_DRAWS = "draws"
_CONSUMED = "consumed"
_EXHAUSTED = "exhausted"
_FINISHED = "finished"
_WEIGHTS = "weights"
_CHILDREN = "children"
_MIX_BY = "mix_by"
_UNITS = ("documents", "tokens")


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

    Children are sharded by themselves (sources shard by rank and worker); the interleaver only
    chooses. Nesting is allowed: an ``InterleavedDataset`` is a child like any other.

    For the packer, an infinite mixture of children that read blocks (plain ``ArrowSource`` sources,
    or such mixtures) hands out many draws at once (:meth:`read_block`): the same draws as
    iteration, by reference, with the state after any of them (:meth:`state_after_block`).

    A finished finite interleaver starts a new round (draw counter, accounts and exhausted flags
    reset) on the next ``iter()``; children continue according to their own rules.

    Args:
        datasets: child streams; their ``dataset_name`` must be unique.
        weights: one non-negative finite weight per child, positive sum; normalised to sum to 1
            (a warning is logged when they did not already).
        seed: seed of the jitter (combined with the shard).
        dataset_name: name of this stream (its state key).
        stopping_strategy: ``"infinite"``, ``"first_exhausted"`` or ``"all_exhausted"``.
        rank: this process's rank (capture it in the main process).
        world_size: number of ranks.
        mix_by: ``"documents"`` (weights are shares of documents) or ``"tokens"`` (shares of
            tokens).
    """

    def __init__(
        self,
        datasets: list[TuneIterableDataset],
        weights: list[float],
        seed: int,
        dataset_name: str = "interleaved",
        stopping_strategy: str = "infinite",
        rank: int = 0,
        world_size: int = 1,
        mix_by: str = "documents",
    ) -> None:
        datasets = list(datasets)
        weights = list(weights)
        if not datasets:
            raise ValueError(f"InterleavedDataset '{dataset_name}' needs at least one child dataset.")
        if len(datasets) != len(weights):
            raise ValueError(
                f"InterleavedDataset '{dataset_name}' got {len(datasets)} datasets but {len(weights)} "
                "weights; give exactly one weight per dataset."
            )
        names = [ds.dataset_name for ds in datasets]
        duplicates = sorted(n for n, c in collections.Counter(names).items() if c > 1)
        if duplicates:
            raise ValueError(
                f"InterleavedDataset '{dataset_name}': duplicate child dataset names {duplicates} "
                f"(all names: {names}). Give every child a unique dataset_name; names key the "
                "saved state and the per-source metrics."
            )
        for name, w in zip(names, weights):
            if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) or w < 0:
                raise ValueError(
                    f"InterleavedDataset '{dataset_name}': weight {w!r} of child '{name}' is invalid; "
                    "weights must be finite numbers >= 0."
                )
        total = float(sum(weights))
        if total <= 0:
            raise ValueError(
                f"InterleavedDataset '{dataset_name}': weights {dict(zip(names, weights))} sum to 0; "
                "give at least one child a positive weight."
            )
        if stopping_strategy not in STOPPING_STRATEGIES:
            raise ValueError(
                f"InterleavedDataset '{dataset_name}': unknown stopping_strategy "
                f"{stopping_strategy!r}; choose one of {list(STOPPING_STRATEGIES)}."
            )
        if mix_by not in MIX_BY:
            raise ValueError(f"InterleavedDataset '{dataset_name}': mix_by={mix_by!r}; choose one of {list(MIX_BY)}.")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"InterleavedDataset '{dataset_name}': need 0 <= rank < world_size, got rank={rank}, "
                f"world_size={world_size}."
            )
        normalised = [float(w) / total for w in weights]
        if abs(total - 1.0) > 1e-6:
            logger.warning(
                "InterleavedDataset '%s' normalised weights %s (sum %.6g) to %s.",
                dataset_name, dict(zip(names, weights)), total,
                {n: round(w, 6) for n, w in zip(names, normalised)},
            )
        self._dataset_name = dataset_name
        self._datasets = datasets
        self._names = names
        self._weights = normalised
        self._seed = int(seed) % 2**64  # numpy seeds must be non-negative
        self._name_key = zlib.crc32(dataset_name.encode("utf-8"))
        self._stopping_strategy = stopping_strategy
        self._mix_by = mix_by
        self._rank = rank
        self._world_size = world_size
        self._reset_round()
        self._remaining: dict[str, Any] | None = None

    def _reset_round(self) -> None:
        self._reader: MixedReader | None = None  # the block path's children blocks (see read_block)
        self._draws = 0
        self._consumed = [[0.0, 0.0] for _ in self._datasets]  # [documents, tokens] per child
        self._total_tokens = 0.0
        self._exhausted = [False] * len(self._datasets)
        self._finished = False

    @property
    def dataset_name(self) -> str:
        return self._dataset_name

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def weights(self) -> dict[str, float]:
        """Normalised weights by child name."""
        return dict(zip(self._names, self._weights))

    @property
    def datasets(self) -> list[TuneIterableDataset]:
        """The child streams, in order."""
        return list(self._datasets)

    @property
    def stopping_strategy(self) -> str:
        return self._stopping_strategy

    @property
    def mix_by(self) -> str:
        return self._mix_by

    def _resolve(self) -> None:
        """Take this shard's part of a state merged from another layout (on first use)."""
        if self._remaining is None:
            return
        remaining, self._remaining = self._remaining, None
        num_shards = current_shard(self._rank, self._world_size).num_shards
        self._reset_round()
        consumed = remaining[_CONSUMED]
        self._consumed = [[float(consumed[n][unit]) / num_shards for unit in _UNITS] for n in self._names]

    def _block_uniforms(self, block: int) -> np.ndarray:
        shard = current_shard(self._rank, self._world_size)
        rng = np.random.default_rng([self._seed, self._name_key, shard.num_shards, shard.shard_id, block])
        return rng.random((BLOCK_SIZE, len(self._datasets)))

    def _candidates(self, active: list[int]) -> list[tuple[int, float]]:
        """``(child, 1 / weight)`` of the children a draw may pick (equal shares if only zero weights are left)."""
        weighted = [(i, 1.0 / self._weights[i]) for i in active if self._weights[i] > 0]
        return weighted or [(i, 1.0) for i in active]

    def _choose(self, candidates: list[tuple[int, float]], jitter_row: list[float]) -> int:
        unit = 0 if self._mix_by == "documents" else 1
        per_draw = 1.0
        if unit == 1 and self._draws:
            per_draw = max(1.0, self._total_tokens / self._draws)
        jitter = JITTER_DRAWS * per_draw
        consumed = self._consumed
        best, best_score = candidates[0][0], math.inf
        for i, inverse_weight in candidates:
            score = consumed[i][unit] * inverse_weight + jitter * jitter_row[i]
            if score < best_score:
                best, best_score = i, score
        return best

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._resolve()
        if self._finished:  # new round
            self._reset_round()
        iterators: list[Iterator[dict[str, Any]] | None] = [
            None if done else iter(ds) for ds, done in zip(self._datasets, self._exhausted)
        ]
        uniforms: list[Any] = [-1, None]
        warned: set[int] = set()
        self._total_tokens = sum(c[1] for c in self._consumed)
        exhausted_seen, candidates = None, []
        while True:
            if exhausted_seen != self._exhausted:
                active = [i for i, done in enumerate(self._exhausted) if not done]
                if not active:
                    self._finished = True
                    return
                exhausted_seen, candidates = list(self._exhausted), self._candidates(active)
            idx = self._draw(candidates, uniforms)
            sample = next(iterators[idx], _END)
            if sample is _END:
                name = self._names[idx]
                if self._stopping_strategy == "first_exhausted":
                    self._exhausted[idx] = True
                    self._finished = True
                    return
                if self._stopping_strategy == "all_exhausted":
                    self._exhausted[idx] = True
                    iterators[idx] = None
                    continue
                if idx not in warned:  # once per child and iteration, not on every restart
                    warned.add(idx)
                    logger.warning(
                        "InterleavedDataset '%s': child '%s' ended although stopping_strategy="
                        "'infinite' expects infinite children; restarting it.", self._dataset_name, name,
                    )
                iterators[idx] = iter(self._datasets[idx])
                sample = next(iterators[idx], _END)
                if sample is _END:
                    raise RuntimeError(
                        f"InterleavedDataset '{self._dataset_name}': child '{name}' yields nothing "
                        "even after a restart; give it data, or use a finite stopping_strategy."
                    )
            self._count(idx, len(sample[INPUT_IDS]) if INPUT_IDS in sample else 0)
            yield sample

    def _draw(self, candidates: list[tuple[int, float]], uniforms: list[Any]) -> int:
        """One draw: the child the mix's rule picks next. ``uniforms`` is the caller's
        ``[block index, rows]`` of jitter uniforms, refreshed here when the draw enters a new block."""
        block, row = divmod(self._draws, BLOCK_SIZE)
        if block != uniforms[0]:
            uniforms[0], uniforms[1] = block, self._block_uniforms(block).tolist()
        index = self._choose(candidates, uniforms[1][row])
        self._draws += 1
        return index

    def _count(self, index: int, tokens: int) -> list[float]:
        """Add one drawn document of ``tokens`` tokens to child ``index``'s account; returns the account."""
        account = self._consumed[index]
        account[0] += 1
        account[1] += tokens
        self._total_tokens += tokens
        return account

    def read_document(self, source: str, row: int, epoch: int) -> dict[str, Any] | None:
        for child in self._datasets:
            document = child.read_document(source, row, epoch)
            if document is not None:
                return document
        return None

    def state_dict(self) -> dict[str, Any]:
        return self.snapshot()()

    def snapshot(self) -> Callable[[], dict[str, Any]]:
        """A record of the position after the last document handed out, taken in a few
        microseconds per child; calling it returns :meth:`state_dict`'s result for that position.
        The train loader takes one after every batch and builds the state only when a checkpoint
        asks."""
        self._resolve()
        children = [ds.snapshot() for ds in self._datasets]
        draws, consumed = self._draws, [list(account) for account in self._consumed]
        exhausted, finished = list(self._exhausted), self._finished

        def build() -> dict[str, Any]:
            children_state: dict[str, Any] = {}
            for child in children:
                children_state.update(child())
            return self.state_from(draws, consumed, children_state, exhausted, finished)

        return build

    def state_from(self, draws: int, consumed: list[list[float]], children: dict[str, Any],
                   exhausted: list[bool] | None = None, finished: bool = False) -> dict[str, Any]:
        """The state with these draws, accounts and children's states (the settings are this mixture's)."""
        return {
            self._dataset_name: {
                _DRAWS: draws,
                _CONSUMED: {n: dict(zip(_UNITS, c)) for n, c in zip(self._names, consumed)},
                _EXHAUSTED: dict(zip(self._names, exhausted or [False] * len(self._names))),
                _FINISHED: finished,
                _WEIGHTS: dict(zip(self._names, self._weights)),
                _MIX_BY: self._mix_by,
                _CHILDREN: children,
            }
        }

    # -- blocks of document references (the packer's fast path) ------------------------------
    def blocks_supported(self) -> bool:
        """Whether :meth:`read_block` may be used: an infinite mixture of children that read blocks
        and never end (a finite child or stopping strategy is iterated one document at a time)."""
        return self._stopping_strategy == "infinite" and all(
            getattr(child, "num_passes", None) is None and callable(getattr(child, "blocks_supported", None))
            and child.blocks_supported() for child in self._datasets
        )

    def read_block(self, limit: int) -> MixedBlock:
        """The next ``limit`` documents of the mixture, drawn exactly as iteration draws them.

        Advances past them; :meth:`state_after_block` gives the state after any of them. Only
        when :meth:`blocks_supported`.
        """
        self._resolve()
        if self._reader is None:
            self._reader = MixedReader(self)
        return self._reader.read(limit)

    def state_after_block(self, block: MixedBlock, documents: int) -> dict[str, Any]:
        """The mixture's state right after the first ``documents`` documents of ``block``."""
        if self._reader is None:
            raise ValueError(f"InterleavedDataset '{self._dataset_name}': this block was not read by this mixture.")
        return self._reader.state_after(block, documents)

    def _mix_changed(self, own: dict[str, Any]) -> bool:
        """Whether the saved state was written with other weights or another ``mix_by``."""
        saved_weights = own.get(_WEIGHTS, {})
        return own.get(_MIX_BY, self._mix_by) != self._mix_by or any(
            abs(saved_weights.get(n, -1.0) - w) > 1e-9 for n, w in zip(self._names, self._weights)
        )

    def _saved_accounts(self, own: dict[str, Any]) -> list[list[float]]:
        """The saved accounts, or zeros when the mix changed: new weights apply from the resume on."""
        consumed = own.get(_CONSUMED, {})
        if self._mix_changed(own):
            return [[0.0, 0.0] for _ in self._names]
        return [[float(consumed.get(n, {}).get(u, 0.0)) for u in _UNITS] for n in self._names]

    def _check_children(self, own: dict[str, Any]) -> None:
        missing = [n for n in self._names if n not in own[_CHILDREN]]
        if missing:
            raise KeyError(
                f"InterleavedDataset '{self._dataset_name}': the saved state has no entry for "
                f"children {missing} (it holds {sorted(own[_CHILDREN])}). The mixture changed since the "
                "checkpoint; restore with the same dataset names."
            )
        saved_weights = own.get(_WEIGHTS, {})
        if saved_weights and any(
            abs(saved_weights.get(n, -1.0) - w) > 1e-9 for n, w in zip(self._names, self._weights)
        ):
            logger.warning(
                "InterleavedDataset '%s': the checkpoint was written with weights %s, resuming "
                "with %s; the continuation will differ from the uninterrupted run.",
                self._dataset_name, {n: round(w, 6) for n, w in saved_weights.items()},
                {n: round(w, 6) for n, w in self.weights.items()},
            )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        own = self._own_state(state_dict)
        self._check_children(own)
        for ds, name in zip(self._datasets, self._names):
            ds.load_state_dict({name: own[_CHILDREN][name]})
        self._remaining = None
        self._draws = int(own[_DRAWS])
        self._consumed = self._saved_accounts(own)
        exhausted = own.get(_EXHAUSTED, {})
        self._exhausted = [bool(exhausted.get(n, False)) for n in self._names]
        self._finished = bool(own.get(_FINISHED, False))
        self._reader = None

    def merge_shard_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        """Sum the old shards' accounts and merge each child's shard states (see the class docstring)."""
        if self._stopping_strategy != "infinite":
            raise ElasticResumeUnsupported(
                f"InterleavedDataset '{self._dataset_name}': a finite stopping_strategy "
                f"({self._stopping_strategy!r}) cannot resume with a different number of ranks or dataloader "
                "workers. Resume with the checkpoint's layout, or start the data fresh (`resume_data_state: false`)."
            )
        owns = [self._own_state(s) for s in states]
        for own in owns:
            self._check_children(own)
        children: dict[str, Any] = {}
        for ds, name in zip(self._datasets, self._names):
            children.update(ds.merge_shard_states([{name: own[_CHILDREN][name]} for own in owns]))
        accounts = [self._saved_accounts(own) for own in owns]
        consumed = {
            name: {unit: sum(account[i][u] for account in accounts) for u, unit in enumerate(_UNITS)}
            for i, name in enumerate(self._names)
        }
        return {self._dataset_name: {_CONSUMED: consumed, _CHILDREN: children}}

    def load_global_state(self, global_state: dict[str, Any]) -> None:
        own = self._own_state(global_state)
        for ds in self._datasets:
            ds.load_global_state(own[_CHILDREN])
        self._remaining = own
        self._reader = None


def interleave_datasets(
    datasets: list[Iterable],
    probabilities: list[float] | None = None,
    seed: int | None = None,
    stopping_strategy: str = "first_exhausted",
) -> Iterator:
    """Interleave plain iterables by weighted random choice (a framework-agnostic utility).

    Validation happens at call time; the returned iterator does the sampling.

    Args:
        datasets: iterables to interleave.
        probabilities: one sampling probability per iterable; must be >= 0 and sum to 1.
            ``None`` alternates between the iterables in order (round-robin), as the
            ``datasets`` library does.
        seed: seed of the ``random.Random`` that picks the iterable for each item.
        stopping_strategy: ``"first_exhausted"`` stops as soon as a picked iterable is found
            exhausted; ``"all_exhausted"`` drops exhausted iterables, renormalises the remaining
            probabilities (equal shares if they are all 0) and continues until every iterable is
            exhausted, yielding every item exactly once.

    Returns:
        An iterator over the interleaved items.

    Raises:
        ValueError: lengths differ, probabilities are negative or don't sum to 1, or the
            stopping strategy is unknown.
    """
    datasets = list(datasets)
    if probabilities is None:
        if stopping_strategy not in ("first_exhausted", "all_exhausted"):
            raise ValueError(
                f"interleave_datasets: stopping_strategy must be 'first_exhausted' or 'all_exhausted', "
                f"got {stopping_strategy!r}."
            )
        return _round_robin(datasets, stopping_strategy)
    probabilities = [float(p) for p in probabilities]
    if len(datasets) != len(probabilities):
        raise ValueError(
            f"interleave_datasets: the number of datasets ({len(datasets)}) and probabilities "
            f"({len(probabilities)}) must be the same."
        )
    bad = [p for p in probabilities if not math.isfinite(p) or p < 0]
    if bad:
        raise ValueError(f"interleave_datasets: probabilities must be finite and >= 0, got {probabilities}.")
    if datasets and abs(sum(probabilities) - 1.0) >= 1e-6:
        raise ValueError(
            f"interleave_datasets: probabilities must sum to 1.0, got {probabilities} "
            f"(sum {sum(probabilities):.6g}); divide them by their sum."
        )
    if stopping_strategy not in ("first_exhausted", "all_exhausted"):
        raise ValueError(
            f"interleave_datasets: stopping_strategy must be 'first_exhausted' or 'all_exhausted', "
            f"got {stopping_strategy!r}."
        )
    return _interleave(datasets, probabilities, seed, stopping_strategy)


def _interleave(
    datasets: list[Iterable], probabilities: list[float], seed: int | None, stopping_strategy: str
) -> Iterator:
    rng = random.Random(seed)
    iterators = [iter(ds) for ds in datasets]
    active = list(range(len(iterators)))
    active_probabilities = list(probabilities)
    while active:
        if sum(active_probabilities) > 0:
            k = rng.choices(range(len(active)), weights=active_probabilities, k=1)[0]
        else:  # every remaining probability is 0: equal shares
            k = rng.randrange(len(active))
        item = next(iterators[active[k]], _END)
        if item is not _END:
            yield item
            continue
        if stopping_strategy == "first_exhausted":
            return
        active.pop(k)
        active_probabilities.pop(k)
        total = sum(active_probabilities)
        if active_probabilities and total > 0:
            active_probabilities = [p / total for p in active_probabilities]


def _round_robin(datasets: list[Iterable], stopping_strategy: str) -> Iterator:
    iterators = [iter(ds) for ds in datasets]
    while iterators:
        for iterator in list(iterators):
            item = next(iterator, _END)
            if item is not _END:
                yield item
                continue
            if stopping_strategy == "first_exhausted":
                return
            iterators.remove(iterator)
