"""Reading one shard's rows of a ``datasets`` stream, a pass at a time, and turning rows into documents.

The ``world_size x num_workers`` shards cut the stream into consecutive groups of ``num_shards``
rows; shard ``s`` takes row ``s`` of every complete group. Every shard reads the whole stream
through a private copy (``copy.deepcopy``, about 1 ms), via ``IterableDataset.iter(batch_size=1)``,
which never splits itself by dataloader worker. The position is the rows consumed in the pass
(all shards' rows counted) and the ``datasets`` stream's own state there; a network failure
re-opens the copy at that state, within the source's :class:`~lightning_tune_data.sources.retries.RetryPolicy`.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from lightning_tune_data.distributed import ShardInfo
from lightning_tune_data.keys import INPUT_IDS, LOSS_MASK, PREPROCESS_ERROR
from lightning_tune_data.sources.retries import Reopenings, RetryPolicy, stream_files, without_datasets_read_retries
from lightning_tune_data.sources.shuffle_buffer import StreamDocument

__all__ = ["StreamReader", "check_stream", "row_document"]


def _uses_hf_shuffle(dataset: Any) -> bool:
    """Whether ``dataset``'s pipeline contains a ``datasets`` shuffle buffer (best effort)."""
    pending = [getattr(dataset, "_ex_iterable", None)]
    while pending:
        node = pending.pop()
        if node is None:
            continue
        if type(node).__name__ == "BufferShuffledExamplesIterable":
            return True
        pending.append(getattr(node, "ex_iterable", None))
        pending.extend(getattr(node, "ex_iterables", None) or [])
    return False


def check_stream(dataset: Any, source: str) -> None:
    """Refuse what a streaming source cannot read exactly: a map-style dataset, a stream already
    split by node, or one shuffled by ``datasets``.

    Args:
        dataset: what the source was given.
        source: the source's name.
    """
    import datasets  # local: keep the package importable without touching `datasets` eagerly

    if not isinstance(dataset, datasets.IterableDataset):
        raise TypeError(
            f"Source '{source}': HFStreamingSource needs a datasets.IterableDataset "
            f"(load_dataset(..., streaming=True)), got {type(dataset).__name__}. Use ArrowSource for "
            "a cached datasets.Dataset."
        )
    if getattr(dataset, "_distributed", None) is not None:
        raise ValueError(
            f"Source '{source}': the stream was split with datasets' split_dataset_by_node. Pass "
            "the unsplit stream and rank/world_size instead; HFStreamingSource shards by rank itself."
        )
    if _uses_hf_shuffle(dataset):
        raise ValueError(
            f"Source '{source}': the stream was shuffled with datasets' IterableDataset.shuffle, "
            "whose resume loses and repeats samples. Remove the .shuffle(...) call and use this "
            "source's shuffle/shuffle_buffer_size instead."
        )


def row_document(row: dict[str, Any]) -> StreamDocument:
    """One stream row (a batch of one) as a document: int64 token ids and an optional bool mask.

    Args:
        row: the row as ``IterableDataset.iter(batch_size=1)`` gives it.

    Raises:
        ValueError, KeyError: the row was tagged as failed by preprocessing, or its columns are
            missing, not integer, not 1-D, or of different lengths.
    """
    failure = row.get(PREPROCESS_ERROR, [None])[0]
    if failure is not None:
        raise ValueError(f"preprocessing failed: {failure}")
    if INPUT_IDS not in row:
        raise KeyError(
            f"the row has no '{INPUT_IDS}' column (columns: {sorted(row)}); the manager's preprocess "
            f"(.map) must return '{INPUT_IDS}'"
        )
    ids = np.asarray(row[INPUT_IDS][0])
    if ids.ndim != 1:
        raise ValueError(f"'{INPUT_IDS}' must be a flat list of token ids, got shape {ids.shape}")
    if ids.size and ids.dtype.kind not in "iu":
        raise ValueError(f"'{INPUT_IDS}' must hold integer token ids, got dtype {ids.dtype}")
    ids = ids.astype(np.int64, copy=False)
    mask = None
    if LOSS_MASK in row and row[LOSS_MASK][0] is not None:
        mask = np.asarray(row[LOSS_MASK][0])
        if mask.size and mask.dtype.kind not in "biu":
            raise ValueError(f"'{LOSS_MASK}' must hold booleans, got dtype {mask.dtype}")
        mask = mask.astype(bool, copy=False)
        if mask.shape != ids.shape:
            raise ValueError(f"'{LOSS_MASK}' has shape {mask.shape} but '{INPUT_IDS}' has shape {ids.shape}")
    return ids, mask


class StreamReader:
    """One shard's position in the current pass over a ``datasets`` stream, and its reading.

    Args:
        dataset: the ``datasets.IterableDataset`` (never read itself: each pass reads a copy).
        source: the source's name (for errors).
        retries: the source's retry policy.
        log: where re-opens are reported (the source's logger).
    """

    def __init__(self, dataset: Any, source: str, retries: RetryPolicy, log: logging.Logger) -> None:
        self.dataset = dataset
        self.source = source
        self.retries = retries
        self.log = log
        #: Stream rows consumed in this pass (every shard's rows counted).
        self.position = 0
        #: Whether the stream ended in this pass (the shuffle buffer may still hold documents).
        self.stream_done = False
        self._hf_state: dict[str, Any] | None = None  # the stream's state at `position` when not live
        self._live: Any = None  # the private copy being read in this pass (its state is live)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_hf_state"] = self.hf_state()
        state["_live"] = None
        return state

    def hf_state(self) -> dict[str, Any] | None:
        """The ``datasets`` stream state at :attr:`position` (a fresh copy)."""
        if self._live is not None:
            return self._live.state_dict()
        return copy.deepcopy(self._hf_state)

    def restore(self, position: int, stream_done: bool, hf_state: dict[str, Any] | None) -> None:
        """Continue from a saved position.

        Args:
            position: stream rows consumed in the pass.
            stream_done: whether the stream had ended.
            hf_state: the ``datasets`` stream's state at ``position``.
        """
        self.position = position
        self.stream_done = stream_done
        self._hf_state = copy.deepcopy(hf_state)
        self._live = None

    def next_pass(self) -> None:
        """Start the next pass at the stream's first row."""
        self.position = 0
        self.stream_done = False
        self._hf_state = None

    def rows(self, shard: ShardInfo, epoch: int) -> Iterator[tuple[int, dict[str, Any]]]:
        """This shard's rows for the rest of the pass, in stream order, with their index in the stream.

        :attr:`position` (and the live stream state) advance a whole group of ``num_shards`` rows
        before the shard's row of that group is handed out, so the position seen at any yield
        describes exactly the rows consumed.

        Args:
            shard: this process's shard.
            epoch: the pass being read (for errors).

        Raises:
            ValueError: the position is not at a group boundary (a state of another sharding).
            RuntimeError: the stream failed with an error that is not transient, or kept failing.
        """
        if self.position % shard.num_shards:
            raise ValueError(
                f"Source '{self.source}': saved position {self.position} is not a multiple of the "
                f"{shard.num_shards} shards; the state was written with a different sharding."
            )
        group_state = self._hf_state  # the stream's state at `position` (where a retry restarts)
        live, rows = self._open(group_state)
        reopenings = Reopenings(self.retries)
        while True:
            group: list[dict[str, Any]] = []
            try:
                with without_datasets_read_retries():
                    while len(group) < shard.num_shards:
                        group.append(next(rows))
            except StopIteration:
                self._live = None
                self._hf_state = None
                self.stream_done = True
                return
            except Exception as exc:
                row, files = self.position + len(group), stream_files(self.dataset)
                delay = reopenings.delay_after(exc, files, f"row {row} of pass {epoch}")
                self.log.warning(
                    "Source '%s': reading %s failed at row %d (%s: %s); re-opening at that row in %.2fs "
                    "[%d/%d].", self.source, files, row, type(exc).__name__, exc, delay,
                    reopenings.count, self.retries.max_retries,
                )
                time.sleep(delay)
                live, rows = self._open(group_state)
                continue
            reopenings.count = 0
            index = self.position + shard.shard_id
            self.position += shard.num_shards
            group_state = live.state_dict()
            yield index, group[shard.shard_id]

    def _open(self, state: dict[str, Any] | None) -> tuple[Any, Iterator[dict[str, Any]]]:
        """A private copy of the stream positioned at ``state`` (``None``: the pass start)."""
        live = copy.deepcopy(self.dataset)  # private copy: its pipeline state is ours alone
        if state is not None:
            live.load_state_dict(state)
        self._live = live
        return live, live.iter(batch_size=1)  # unlike iter(live), never splits itself by worker
