"""The train loader's state with dataloader workers, recorded after every batch at a cost that does
not grow with the state, and built only when a checkpoint asks for it.

torchdata's ``StatefulDataLoader`` (``snapshot_every_n_steps=1``, which exact resume needs) keeps
each worker's state as a flat dict updated by the delta that comes with every batch, and after
every batch rebuilds every worker's nested state from those flat dicts; it also asks two typing
protocols (``isinstance(x, Stateful)``) about its sampler for every batch it requests. With
workers, where the main process only receives batches, that was a third of its CPU time per
batch. :class:`TrainDataLoader` keeps the same information and builds the same state dict:

* a delta replaces a worker's flat dict by an updated copy (copy on write; a dict copy, no
  Python loop) instead of changing it in place, so a recorded state is a tuple of references to
  the flat dicts of its moment, kept as long as the loader keeps that state;
* the nested state is built from them (torchdata's own ``_unflatten``) when ``state_dict()`` or a
  recorded state is called: at a checkpoint;
* whether the sampler and its iterators are ``Stateful`` is asked once per object;
* an iterable dataset reaches the workers wrapped in :class:`EncodedStateStream`, whose
  ``state_dict()`` is the stream's state pickled into one ``bytes`` value: torchdata then sends
  that value as the delta of every batch, which the main process receives as one string (a copy)
  instead of unpickling the stream's nested state (a packer's open packs are thousands of ints)
  at every batch; it is decoded when a state is built.

The states it builds are the ones ``StatefulDataLoader`` builds, key for key (tested against it),
and it restores from them the same way. This module and ``checkpoint.py`` are the two places that
know torchdata's private layout, so a torchdata change shows up here.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

from torch.utils.data import IterableDataset
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.incremental_state import (
    _DATASET_ITER_STATE,
    _DATASET_STATE,
    _FETCHER_ENDED,
    _FETCHER_STATE,
    _WORKER_ID,
    _unflatten,
)
from torchdata.stateful_dataloader.sampler import _BatchSamplerIterator
from torchdata.stateful_dataloader.stateful import Stateful
from torchdata.stateful_dataloader.stateful_dataloader import (
    _INDEX_SAMPLER_STATE,
    _ITERABLEDATASET_LEN_CALLED,
    _ITERATOR_FINISHED,
    _SAMPLER_ITER_STATE,
    _SAMPLER_ITER_YIELDED,
    _SHARED_SEED,
    _StatefulMultiProcessingDataLoaderIter,
)

__all__ = ["ENCODED_STATE", "EncodedStateStream", "TrainDataLoader", "decoded_state"]

#: A recorded state: snapshot step, last yielded worker, main snapshot, and per worker
#: ``(key, worker id, fetcher ended, flat dataset state, flat dataset-iterator state)``.
_Recorded = tuple[int, int, dict, list[tuple[str, Any, Any, dict, dict]]]


#: The key of :class:`EncodedStateStream`'s state: the stream's state, pickled.
ENCODED_STATE = "encoded_stream_state"


class EncodedStateStream(IterableDataset):
    """An iterable dataset as dataloader workers see it: the same items, its state as one pickled value.

    Args:
        stream: the train stream (``state_dict``/``load_state_dict``).
    """

    def __init__(self, stream: IterableDataset) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[Any]:
        return iter(self.stream)

    def state_dict(self) -> dict[str, bytes]:
        """``{ENCODED_STATE: the stream's state, pickled}``."""
        return {ENCODED_STATE: pickle.dumps(self.stream.state_dict(), protocol=pickle.HIGHEST_PROTOCOL)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load an encoded state or the stream's own.

        Args:
            state: what :meth:`state_dict` returned, or the stream's plain state.
        """
        self.stream.load_state_dict(decoded_state(state))


def decoded_state(state: Any) -> Any:
    """The stream state an :class:`EncodedStateStream` state holds; any other state as is.

    Args:
        state: a worker's dataset state.
    """
    if isinstance(state, dict) and len(state) == 1 and ENCODED_STATE in state:
        return pickle.loads(state[ENCODED_STATE])
    return state


class TrainDataLoader(StatefulDataLoader):
    """A ``StatefulDataLoader`` whose iterator, with workers, records states lazily (module docstring).

    Takes the arguments of ``StatefulDataLoader`` (an iterable dataset is wrapped in
    :class:`EncodedStateStream` when there are workers). Without workers it is ``StatefulDataLoader``.
    """

    def __init__(self, dataset: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("num_workers", 0) > 0 and isinstance(dataset, IterableDataset):
            dataset = EncodedStateStream(dataset)
        super().__init__(dataset, *args, **kwargs)

    def _get_iterator(self) -> Any:
        if self.num_workers == 0:
            return super()._get_iterator()
        self.check_worker_number_rationality()
        iterator = _RecordingWorkersIterator(self, self.next_iter_state)
        self.next_iter_state = None
        return iterator


class _RecordingWorkersIterator(_StatefulMultiProcessingDataLoaderIter):
    """torchdata's multiprocessing iterator with lazily built snapshots."""

    _recorded: _Recorded

    def _update_worker_snapshot(self, worker_key: str, state_dict: dict | None) -> None:
        if state_dict is None:
            return
        worker = self._worker_snapshots[worker_key]
        if state_dict.get(_DATASET_STATE):  # copy on write: recorded states keep the dicts of their moment
            worker._incr_dataset_state.flat_state = dict(worker._incr_dataset_state.flat_state or {})
        fetcher = state_dict.get(_FETCHER_STATE)
        if fetcher is not None and fetcher.get(_DATASET_ITER_STATE):
            worker._incr_fetcher_iter_state.flat_state = dict(worker._incr_fetcher_iter_state.flat_state or {})
        worker.apply_delta(state_dict)

    def _update_snapshot(self, snapshot_step: int, last_yielded_worker_id: int, num_workers: int,
                         main_snapshot: dict, worker_snapshots: dict) -> None:
        workers = [(key, worker._worker_id, worker._fetcher_ended, worker._incr_dataset_state.flat_state,
                    worker._incr_fetcher_iter_state.flat_state) for key, worker in worker_snapshots.items()]
        self._recorded = (snapshot_step, last_yielded_worker_id, main_snapshot, workers)
        # torchdata's state_dict() reads the step from here; the rest is built on demand.
        self._snapshot = {self._SNAPSHOT_STEP: snapshot_step}

    def recorded_state(self) -> Callable[[], dict[str, Any]]:
        """The state after the batches handed out so far, built when called (references only now)."""
        return partial(_built_state, self._recorded, self._num_yielded, self._finished)

    def state_dict(self) -> dict[str, Any]:
        return _built_state(self._recorded, self._num_yielded, self._finished)

    def _get_main_state(self) -> dict[str, Any]:
        return {
            self._NUM_WORKERS: self._num_workers,
            _SAMPLER_ITER_STATE: self._serialized(self._sampler_iter),
            _INDEX_SAMPLER_STATE: self._serialized(self._index_sampler),
            _SAMPLER_ITER_YIELDED: self._sampler_iter_yielded,
            _ITERABLEDATASET_LEN_CALLED: self._IterableDataset_len_called,
            _SHARED_SEED: self._shared_seed,
            self._BASE_SEED: self._base_seed,
        }

    def _serialized(self, obj: Any) -> Any:
        """``try_to_serialize(obj)``, with the protocol checks made once per object (torchdata's
        batch sampler iterator's ``state_dict`` makes two more per call: its state is built here)."""
        if type(obj) is _BatchSamplerIterator:
            state = {obj._SAMPLES_YIELDED: obj.samples_yielded}
            if self._stateful(obj.sampler):
                state[obj._SAMPLER_STATE] = obj.sampler.state_dict()
            if self._stateful(obj.sampler_iter):
                state[obj._SAMPLER_ITER_STATE] = obj.sampler_iter.state_dict()
            return state
        return obj.state_dict() if self._stateful(obj) else None

    def _stateful(self, obj: Any) -> bool:
        """``isinstance(obj, Stateful)``, asked once per object."""
        known = self.__dict__.setdefault("_stateful_objects", {})
        entry = known.get(id(obj))
        if entry is None or entry[0] is not obj:
            entry = known[id(obj)] = (obj, isinstance(obj, Stateful))
        return entry[1]


def _built_state(recorded: _Recorded, yielded: int, finished: bool) -> dict[str, Any]:
    """The state dict ``StatefulDataLoader.state_dict()`` returns, from a recorded state."""
    step, last_worker, main_snapshot, workers = recorded
    cls = _StatefulMultiProcessingDataLoaderIter
    worker_states = {}
    for key, worker_id, ended, dataset_flat, iterator_flat in workers:
        fetcher = None if ended is None else {_FETCHER_ENDED: ended, _DATASET_ITER_STATE: _unflatten(iterator_flat)}
        worker_states[key] = {_WORKER_ID: worker_id, _DATASET_STATE: decoded_state(_unflatten(dataset_flat)),
                              _FETCHER_STATE: fetcher}
    snapshot = {cls._SNAPSHOT_STEP: step, cls._LAST_YIELDED_WORKER_ID: last_worker, cls._MAIN_SNAPSHOT: main_snapshot,
                cls._WORKER_SNAPSHOTS: worker_states}
    return {cls._SNAPSHOT: snapshot, cls._STEPS_SINCE_SNAPSHOT: yielded - step, _ITERATOR_FINISHED: finished}
