"""``InMemoryStream``: a sharded, shuffled, exactly resumable stream over Python data.

Users can bring their own tokenised documents as a plain list (token-id lists or document
dicts) and get the same stream semantics as the cached Arrow sources: the order of pass ``p``
is a pure function of ``(seed, name, p)``, every (rank, dataloader worker) shard gets a disjoint
slice of the same size, the state is a few integers, and a resume with another number of ranks
or workers continues the pass in progress without losing or repeating a document.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from lightning_tune_data.distributed import current_shard
from lightning_tune_data.keys import EPOCH, INPUT_IDS, LOSS_MASK, SOURCE, SOURCE_ROW
from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.base import TuneIterableDataset
from lightning_tune_data.sources.pass_order import ShardPasses, merge_remaining, split_remaining
from lightning_tune_data.sources.permutation import KeyedPermutation, permutation_key
from lightning_tune_data.sources.source_state import SourceCounters, shard_mismatch_error
from lightning_tune_data.sources.stream_arguments import settings_property, stream_settings

__all__ = ["InMemoryStream"]

# State keys (the same as an ArrowSource's).
_WALK = "walk"
_COUNTERS = "counters"
#: Positions mapped to documents per permutation call.
_BLOCK = 512


def _to_document(item: Any, index: int, dataset_name: str) -> dict[str, Any]:
    """Validate one user item and convert it to ``{"input_ids": int64, ["loss_mask": bool], ...}``."""
    where = f"document {index} of stream '{dataset_name}'"
    if isinstance(item, Mapping):
        if INPUT_IDS not in item:
            raise ValueError(
                f"{where} is a dict without an '{INPUT_IDS}' field (keys: {sorted(item)}); "
                f"give each document dict the token ids under '{INPUT_IDS}'."
            )
        doc = {k: v for k, v in item.items() if k not in (SOURCE, EPOCH)}
        raw_ids = item[INPUT_IDS]
    else:
        doc = {}
        raw_ids = item
    try:
        ids = np.asarray(raw_ids)
    except (TypeError, ValueError) as err:  # ragged nested lists and the like
        raise ValueError(f"{where}: '{INPUT_IDS}' is not a flat sequence of token ids ({err}).") from err
    if ids.ndim != 1:
        raise ValueError(
            f"{where}: '{INPUT_IDS}' must be a flat (1-D) sequence of token ids, got shape {ids.shape}."
        )
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"{where}: '{INPUT_IDS}' must hold integer token ids, got dtype {ids.dtype}; "
            "tokenise the text before building the stream."
        )
    doc[INPUT_IDS] = ids.astype(np.int64, copy=True)
    if LOSS_MASK in doc and doc[LOSS_MASK] is not None:
        mask = np.asarray(doc[LOSS_MASK], dtype=bool)
        if mask.shape != doc[INPUT_IDS].shape:
            raise ValueError(
                f"{where}: '{LOSS_MASK}' has shape {mask.shape} but '{INPUT_IDS}' has shape "
                f"{doc[INPUT_IDS].shape}; give one flag per token."
            )
        doc[LOSS_MASK] = mask.copy()
    else:
        doc.pop(LOSS_MASK, None)
    return doc


class InMemoryStream(TuneIterableDataset):
    """Stream over an in-memory list of documents, sharded by (rank, worker) and reshuffled per pass.

    Each pass visits a keyed permutation of the documents (or the input order when
    ``shuffle=False``). Shard ``t`` of ``S`` (``world_size × num_workers``) takes every ``S``-th
    position of it from ``t``, ``len(data) // S`` documents per pass, so every shard of every
    rank yields the same number of documents per pass (a rank can never run dry before the
    others). Up to ``S - 1`` documents per pass are left out; which ones changes every pass.

    Samples are document samples (see :mod:`lightning_tune_data.sources.base`): ``input_ids`` (``np.int64``),
    ``loss_mask`` (when the input had one), ``source`` (= ``dataset_name``), ``epoch`` (= pass),
    ``source_row`` (the index in ``data``), plus any other keys of an input document dict.
    Empty documents are skipped and counted (``counters["empty_skipped"]``, as an ``ArrowSource``
    counts them); a shard whose pass holds only empty documents is an error.

    A finite stream (``num_passes`` set) raises ``StopIteration`` after its last pass; calling
    ``iter()`` again on a finished stream starts it over from pass 0 (like a list).

    Args:
        data: the documents: token-id sequences, or dicts with ``input_ids`` and optionally
            ``loss_mask`` (one bool per token, ``True`` = training target) and other fields.
        dataset_name: unique name of the stream (state key and ``source`` of its samples).
        seed: seed of the per-pass shuffle.
        shuffle: shuffle each pass; ``False`` keeps the input order (still sharded).
        num_passes: number of passes before the stream ends; ``None`` (default) = infinite.
        rank: this process's rank (capture it in the main process).
        world_size: number of ranks.
        settings: the run's settings, instead of ``seed``, ``num_passes``, ``rank`` and
            ``world_size`` (which then keep their defaults). Its ``max_seq_len`` and ``overlong``
            do not apply here: the packer or the collator fits documents to the sequence length.
    """

    rank = settings_property("rank")
    world_size = settings_property("world_size")

    def __init__(
        self,
        data: Sequence[Sequence[int] | np.ndarray | Mapping[str, Any]],
        dataset_name: str,
        seed: int = 0,
        shuffle: bool = True,
        num_passes: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        settings: StreamSettings | None = None,
    ) -> None:
        if not isinstance(dataset_name, str) or not dataset_name:
            raise ValueError(f"dataset_name must be a non-empty string, got {dataset_name!r}.")
        if num_passes is not None and (not isinstance(num_passes, int) or num_passes < 1):
            raise ValueError(
                f"num_passes of stream '{dataset_name}' must be a positive int or None (infinite), "
                f"got {num_passes!r}."
            )
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"Stream '{dataset_name}': need 0 <= rank < world_size, got rank={rank}, "
                f"world_size={world_size}."
            )
        if len(data) == 0:
            raise ValueError(f"Stream '{dataset_name}' was given no documents; pass a non-empty list.")
        self.settings = stream_settings(settings, dataset_name, seed=int(seed), num_passes=num_passes, rank=rank,
                                        world_size=world_size)
        self._dataset_name = dataset_name
        self._docs = [_to_document(item, i, dataset_name) for i, item in enumerate(data)]
        self._shuffle = bool(shuffle)
        self._walk: ShardPasses | None = None
        self._remaining: dict[str, Any] | None = None
        self._counters = SourceCounters()

    @property
    def dataset_name(self) -> str:
        """The stream's name (the ``source`` of its samples)."""
        return self._dataset_name

    def __len__(self) -> int:
        """Number of documents held (all shards together)."""
        return len(self._docs)

    @property
    def counters(self) -> dict[str, int]:
        """What this shard skipped so far, by reason (``empty_skipped``; see :class:`SourceCounters`)."""
        return self._counters.state_dict()

    @property
    def epochs_completed(self) -> int:
        """Completed passes over this shard."""
        walk = self._shard_walk()
        return walk.epoch + int(walk.plan.done)

    def _key_permutation(self, pass_index: int) -> KeyedPermutation:
        key = permutation_key(self.settings.seed % 2**64, self._dataset_name, pass_index)
        return KeyedPermutation(len(self._docs), key, self._shuffle)

    def permutation(self, pass_index: int) -> np.ndarray:
        """Order of all documents in pass ``pass_index`` (before sharding); pure in ``(seed, name, pass)``.

        Args:
            pass_index: 0-based pass number.
        """
        return self._key_permutation(pass_index)(np.arange(len(self._docs)))

    def _shard_walk(self) -> ShardPasses:
        shard = current_shard(self.settings.rank, self.settings.world_size)
        if self._remaining is not None:
            remaining, self._remaining = self._remaining, None
            self._walk = split_remaining(remaining[_WALK], len(self._docs), shard.num_shards, shard.shard_id)
            self._counters.load_state_dict(remaining[_COUNTERS] if shard.shard_id == 0 else {})
        elif self._walk is None:
            self._walk = ShardPasses(len(self._docs), shard.num_shards, shard.shard_id)
        elif (self._walk.num_shards, self._walk.shard_id) != (shard.num_shards, shard.shard_id):
            raise shard_mismatch_error(self._dataset_name, self._walk.shard_id, self._walk.num_shards, shard)
        return self._walk

    def _finished(self, walk: ShardPasses) -> bool:
        return self.settings.num_passes is not None and walk.epoch >= self.settings.num_passes

    def _sample(self, index: int, epoch: int) -> dict[str, Any]:
        doc = self._docs[index]
        sample = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in doc.items()}
        sample[SOURCE] = self._dataset_name
        sample[EPOCH] = epoch
        sample[SOURCE_ROW] = index
        return sample

    def read_document(self, source: str, row: int, epoch: int) -> dict[str, Any] | None:
        """Document ``row`` as yielded in pass ``epoch`` (``None`` if ``source`` is another stream)."""
        return self._sample(int(row), int(epoch)) if source == self._dataset_name else None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        shard = current_shard(self.settings.rank, self.settings.world_size)
        if len(self._docs) // shard.num_shards == 0:
            raise ValueError(
                f"Stream '{self._dataset_name}' has {len(self._docs)} documents but "
                f"{shard.num_shards} shards (world_size={shard.world_size} x "
                f"num_workers={shard.num_workers}); every shard needs at least one document. "
                "Use fewer dataloader workers/ranks or more data."
            )
        walk = self._shard_walk()
        if self._finished(walk):  # a new round over a finished finite stream
            walk = self._walk = ShardPasses(len(self._docs), shard.num_shards, shard.shard_id)
            self._counters.load_state_dict({})
        while True:
            if walk.plan.done:  # roll over lazily: the end is found on the next call
                walk.next_pass()
                if self._finished(walk):
                    return
                continue
            plan, epoch = walk.plan, walk.epoch
            judged, yielded = plan.untouched_fresh, 0
            while not plan.done:
                for index in self._key_permutation(epoch)(plan.upcoming(_BLOCK)).tolist():
                    plan.advance()
                    if len(self._docs[index][INPUT_IDS]) == 0:
                        self._counters.empty_skipped += 1  # skipped: it would make a zero-width row
                        continue
                    yielded += 1
                    yield self._sample(index, epoch)
            if judged and yielded == 0:
                raise RuntimeError(
                    f"Stream '{self._dataset_name}': a full pass over shard {shard.shard_id} of {shard.num_shards} "
                    f"({len(plan)} documents) produced no usable document: they are all empty."
                )

    def state_dict(self) -> dict[str, Any]:
        """``{name: {"walk": ..., "counters": ...}}``: this shard's position in its passes and what it skipped."""
        walk = self._shard_walk().state_dict()
        return {self._dataset_name: {_WALK: walk, _COUNTERS: self._counters.state_dict()}}

    def _check_count(self, walk_state: dict[str, Any]) -> None:
        n = int(walk_state["num_rows"])
        if n != len(self._docs):
            raise ValueError(
                f"The saved state of stream '{self._dataset_name}' was written over {n} documents, "
                f"but this stream holds {len(self._docs)}; the data changed since the checkpoint. "
                "Rebuild the stream from the same data, or start without the saved data state."
            )

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` result of this shard."""
        own = self._own_state(state_dict)
        self._check_count(own[_WALK])
        walk = ShardPasses.from_state(own[_WALK])
        shard = current_shard(self.settings.rank, self.settings.world_size)
        if (walk.num_shards, walk.shard_id) != (shard.num_shards, shard.shard_id):
            raise shard_mismatch_error(self._dataset_name, walk.shard_id, walk.num_shards, shard)
        self._walk, self._remaining = walk, None
        self._counters.load_state_dict(own.get(_COUNTERS, {}))

    def merge_shard_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        """What every shard of an old layout left unread, and their summed counters, from all their states."""
        owns = [self._own_state(s) for s in states]
        for own in owns:
            self._check_count(own[_WALK])
        return {self._dataset_name: {
            _WALK: merge_remaining([own[_WALK] for own in owns], self._dataset_name),
            _COUNTERS: SourceCounters.total([own.get(_COUNTERS, {}) for own in owns]).state_dict(),
        }}

    def load_global_state(self, global_state: dict[str, Any]) -> None:
        """Continue from a :meth:`merge_shard_states` result; this shard takes its share on first use
        (shard 0 carries the summed counters on)."""
        self._remaining = self._own_state(global_state)
        self._walk = None
