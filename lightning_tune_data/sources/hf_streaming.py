"""``HFStreamingSource``: an infinite, sharded, exactly resumable stream over a ``datasets`` stream.

This is the sibling of :class:`~lightning_tune_data.sources.arrow.ArrowSource` for
managers built with ``streaming=True``: the rows come from a ``datasets.IterableDataset``
(already tokenised lazily by the manager's ``.map``, so every row has ``input_ids`` and
optionally ``loss_mask``) instead of a memory-mapped cache, so there is no random access.

Mental model
------------
* **Passes.** A pass reads the underlying stream once, from its first row to its end. When it
  ends, the next pass starts (``epoch += 1``), forever unless ``num_passes`` is given.
* **Sharding by row, not by file.** The ``world_size x num_workers`` shards (see
  :func:`~lightning_tune_data.distributed.current_shard`) cut the stream into consecutive
  *groups* of ``num_shards`` rows; shard ``s`` takes row ``s`` of every *complete* group, i.e.
  the rows whose running index ``i`` has ``i % num_shards == s``. The last, incomplete group of
  a pass (``rows_in_pass % num_shards`` rows) is dropped by every shard, so every shard gets
  exactly ``rows_in_pass // num_shards`` rows per pass and no rank runs dry. Whole-file
  sharding (``n_shards`` divisible by the shard count) is deliberately *not* used: files have
  different lengths, and equal per-shard counts could then only be guaranteed by reading the
  whole stream first. The price of row striding is that **every shard reads (and, because the
  tokenising ``.map`` is lazy, tokenises) the whole stream** and keeps one row in
  ``num_shards``.
* **No automatic worker split.** A ``datasets.IterableDataset`` iterated with ``iter(ds)``
  inside a DataLoader worker splits itself across workers by file shard (measured with
  ``datasets`` 5.2: a 1-file JSONL stream with 2 workers gives worker 0 all 200 rows and
  worker 1 none, with a "Too many dataloader workers" warning). This source reads the stream
  through the public ``IterableDataset.iter(batch_size=1)`` instead, which never looks at the
  worker info (measured: both workers see all 200 rows), and does the split itself.
* **Shuffling** uses this source's own buffer of ``shuffle_buffer_size`` documents, never
  ``datasets``' ``shuffle`` (whose resume loses and repeats samples; it is rejected here). Once
  the buffer is full each new document replaces a uniformly drawn one, which is yielded; at the
  end of a pass the buffer is drained in random order, so each pass yields exactly that pass's
  rows. Draw ``n`` of a pass comes from a counter-based generator seeded by
  ``(seed, source name, shard, epoch, n // 1024)``: its state is a single integer, and the
  order differs between passes, shards and seeds.

State and resume
----------------
The state is ``epoch``, ``position`` (stream rows consumed in this pass, all shards' rows
counted), the draw counter, the ``datasets`` stream's own ``state_dict()`` at ``position``,
the counters, and **the buffer contents** (token ids and loss masks of up to
``shuffle_buffer_size`` documents). That last part is what makes resume exact, and it costs
``shuffle_buffer_size x mean document length x 8`` bytes per shard (int64 ids, plus 1 byte
per token for loss masks): e.g. 1,000 documents of 2,048 tokens are about 16 MB per dataloader
worker. ``StatefulDataLoader`` snapshots worker state every ``snapshot_every_n_steps`` batches,
so a large buffer makes frequent snapshots expensive; ``shuffle=False`` has no buffer.

Resume repositions the stream with the ``datasets`` stream's own ``load_state_dict``, which is
exact for unshuffled streams and does not re-tokenise the rows before the position (measured
with ``datasets`` 5.2 over 1 and 3 JSONL files split into several Arrow tables each, with
per-row, batched and column-removing ``.map``: the continuation matched the uninterrupted
stream at every cut; a batched ``.map`` re-ran at most one batch). It skips the files already
finished and re-parses, without formatting or tokenising, the current file up to the position,
so its cost is bounded by one file and does not grow with the run length. Skipping
``position`` rows instead would re-read *and re-tokenise* the whole pass up to the position
(the price of a non-indexable source), so it is not used.

Each pass reads a private ``copy.deepcopy`` of the stream (about 1 ms; functions such as the
``.map`` closure are shared, not copied), so two sources over the same ``datasets`` object in
one process never share the pipeline's mutable position.

Errors
------
A row whose ``input_ids``/``loss_mask`` cannot be turned into a document (missing, not
integer, not 1-D, mask length mismatch), or that the manager's preprocessing tagged as failed
(column ``_preprocess_error``: a streaming manager's ``.map`` never raises for a bad row, it
tags it, because an exception inside the ``datasets`` pipeline ends the stream), is skipped
and counted up to ``max_error_count``; one more raises with the first failure's traceback.
An exception that still escapes the ``datasets`` pipeline (e.g. a ``.map`` of your own)
cannot be skipped: it is re-raised with the source name, pass and row. Documents longer than
``max_seq_len`` are truncated or dropped (``overlong``) and counted, as in ``ArrowSource``.

Network failures are retried by this source alone, bounded by its own settings: while it
reads, ``datasets``' own read retries (20 attempts 5 s apart by default, about 100 s before
an error surfaces) are turned off, and an HTTP error status when a file is opened is not
retried by ``datasets`` anyway. An ``OSError`` (``ConnectionError``, ``TimeoutError``, ...) or
``aiohttp.ClientError`` raised by the stream makes this source re-open the stream at the
state of the last row group it consumed and go on, up to ``max_retries`` times in a row with
exponential backoff (``retry_backoff_s``, doubled each time, at most 60 s) and within
``retry_timeout_s`` seconds from the first failure; then it raises an error naming the source
and its data files/URLs. A server that stops answering is a failure once the manager's
``read_timeout_s`` passes without data. Rows are neither lost nor repeated by a retry.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any

import numpy as np

from lightning_tune_data.distributed import ShardInfo, current_shard
from lightning_tune_data.sources.arrow import OVERLONG_POLICIES, _name_key
from lightning_tune_data.sources.base import EPOCH, INPUT_IDS, LOSS_MASK, SOURCE, TuneIterableDataset

__all__ = ["HFStreamingSource"]

log = logging.getLogger(__name__)

#: Longest wait between two attempts to re-open a failing stream.
_MAX_BACKOFF_S = 60.0

# State keys (same style as ArrowSource).
_EPOCH = "epoch"
_POSITION = "position"
_DRAWS = "draws"
_STREAM_DONE = "stream_done"
_HF_STATE = "hf_state"
_BUFFER_LENGTHS = "buffer_lengths"
_BUFFER_INPUT_IDS = "buffer_input_ids"
_BUFFER_HAS_MASK = "buffer_has_loss_mask"
_BUFFER_LOSS_MASK = "buffer_loss_mask"
_BUFFER_SIZE = "shuffle_buffer_size"
_ERRORS = "errors"
_TRUNCATED = "overlong_truncated"
_DROPPED = "overlong_dropped"
_NUM_SHARDS = "num_shards"
_SHARD_ID = "shard_id"

#: Column a streaming manager's preprocessing sets (to the failure's message) on a failed row.
_PREPROCESS_ERROR = "_preprocess_error"

#: Uniform draws generated per counter-seeded block (the RNG state is only the draw counter).
_DRAW_BLOCK = 1024

#: A buffered document: token ids (int64) and an optional bool loss mask.
_Document = tuple[np.ndarray, "np.ndarray | None"]


def _is_transient(error: BaseException) -> bool:
    """Whether ``error`` (or an exception it was raised from) looks like a network/I-O failure."""
    aiohttp = sys.modules.get("aiohttp")
    kinds: tuple[type[BaseException], ...] = (OSError, TimeoutError)
    if aiohttp is not None:
        kinds += (aiohttp.ClientError,)
    seen = 0
    while error is not None and seen < 8:
        if isinstance(error, kinds):
            return True
        error, seen = error.__cause__ or error.__context__, seen + 1
    return False


@contextlib.contextmanager
def without_datasets_read_retries() -> Iterator[None]:
    """Make ``datasets`` try each remote read once, so failures reach this source's own bounded
    retry at once (its default is 20 attempts 5 s apart before an error surfaces)."""
    import datasets

    saved = datasets.config.STREAMING_READ_MAX_RETRIES
    datasets.config.STREAMING_READ_MAX_RETRIES = 1
    try:
        yield
    finally:
        datasets.config.STREAMING_READ_MAX_RETRIES = saved


def _stream_files(dataset: Any, limit: int = 3) -> str:
    """The data files / URLs a ``datasets`` stream reads (best effort, for messages)."""
    files: list[str] = []
    pending = [getattr(dataset, "_ex_iterable", None)]
    while pending:
        node = pending.pop()
        if node is None:
            continue
        kwargs = getattr(node, "kwargs", None) or {}
        for key in ("original_files", "base_files", "files"):
            value = kwargs.get(key)
            if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
                files.extend(v for v in value if v not in files)
                break
        pending.append(getattr(node, "ex_iterable", None))
        pending.extend(getattr(node, "ex_iterables", None) or [])
    if not files:
        return "unknown files"
    shown = files[:limit] + ([f"... ({len(files)} files)"] if len(files) > limit else [])
    return ", ".join(shown)


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


class HFStreamingSource(TuneIterableDataset):
    """Infinite, sharded, shuffled, exactly resumable stream of documents from a ``datasets`` stream.

    See the module docstring for the sharding, shuffling and state model.

    Args:
        dataset: a ``datasets.IterableDataset`` (``streaming=True``) whose rows have
            ``input_ids`` (a list of token ids) and optionally ``loss_mask``. Pass it unsplit
            and unshuffled: this source shards and shuffles itself.
        dataset_name: the source's name; namespaces state and metrics (the manager name).
        seed: base seed (``>= 0``) of the shuffle buffer's draws.
        shuffle: shuffle with a buffer; ``False`` yields this shard's rows in stream order.
        shuffle_buffer_size: documents held by the shuffle buffer (and saved in the state).
        rank, world_size: the DDP coordinates, captured in the main process.
        num_passes: stop after this many passes; ``None`` (default) means infinite.
        max_error_count: how many rows that cannot be read into a document may be skipped (and
            counted) before iteration fails with the first failure's traceback and row.
        max_seq_len: with ``overlong``, the policy for documents longer than this.
        overlong: ``"truncate"`` (keep the first ``max_seq_len`` tokens) or ``"drop"``; both are
            counted in the state (``overlong_truncated`` / ``overlong_dropped``).
        max_retries: how many times in a row a stream failing with a network/I-O error is
            re-opened at the last consumed row before the error is raised (``0``: never).
        retry_backoff_s: wait before the first re-open; doubled for each further one.
        retry_timeout_s: the longest time spent retrying one failure (from the first failed
            read to the last re-open); the error is raised once it is used up.
    """

    def __init__(
        self,
        dataset: Any,
        dataset_name: str,
        seed: int = 0,
        shuffle: bool = True,
        shuffle_buffer_size: int = 1000,
        rank: int = 0,
        world_size: int = 1,
        num_passes: int | None = None,
        max_error_count: int = 0,
        max_seq_len: int | None = None,
        overlong: str = "truncate",
        max_retries: int = 3,
        retry_backoff_s: float = 1.0,
        retry_timeout_s: float = 300.0,
    ) -> None:
        import datasets  # local: keep the package importable without touching `datasets` eagerly

        if not isinstance(dataset, datasets.IterableDataset):
            raise TypeError(
                f"Source '{dataset_name}': HFStreamingSource needs a datasets.IterableDataset "
                f"(load_dataset(..., streaming=True)), got {type(dataset).__name__}. Use ArrowSource for "
                "a cached datasets.Dataset."
            )
        if getattr(dataset, "_distributed", None) is not None:
            raise ValueError(
                f"Source '{dataset_name}': the stream was split with datasets' split_dataset_by_node. Pass "
                "the unsplit stream and rank/world_size instead; HFStreamingSource shards by rank itself."
            )
        if _uses_hf_shuffle(dataset):
            raise ValueError(
                f"Source '{dataset_name}': the stream was shuffled with datasets' IterableDataset.shuffle, "
                "whose resume loses and repeats samples. Remove the .shuffle(...) call and use this "
                "source's shuffle/shuffle_buffer_size instead."
            )
        if overlong not in OVERLONG_POLICIES:
            raise ValueError(f"Source '{dataset_name}': overlong={overlong!r}; use one of {OVERLONG_POLICIES}.")
        if num_passes is not None and num_passes < 1:
            raise ValueError(f"Source '{dataset_name}': num_passes must be >= 1 or None, got {num_passes}.")
        if shuffle and shuffle_buffer_size < 1:
            raise ValueError(
                f"Source '{dataset_name}': shuffle_buffer_size must be >= 1 when shuffling, got "
                f"{shuffle_buffer_size}. Use shuffle=False to read in stream order."
            )
        if int(seed) < 0:
            raise ValueError(f"Source '{dataset_name}': seed must be >= 0, got {seed}.")
        if max_seq_len is not None and max_seq_len < 1:
            raise ValueError(f"Source '{dataset_name}': max_seq_len must be >= 1 or None, got {max_seq_len}.")
        if max_retries < 0 or retry_backoff_s < 0 or retry_timeout_s < 0:
            raise ValueError(
                f"Source '{dataset_name}': max_retries, retry_backoff_s and retry_timeout_s must be >= 0, got "
                f"{max_retries}, {retry_backoff_s} and {retry_timeout_s}."
            )
        self.max_retries = int(max_retries)
        self.retry_backoff_s = float(retry_backoff_s)
        self.retry_timeout_s = float(retry_timeout_s)
        self._dataset = dataset
        self._name = dataset_name
        self.seed = int(seed)
        self.shuffle = shuffle
        self.shuffle_buffer_size = int(shuffle_buffer_size) if shuffle else 0
        self.rank = rank
        self.world_size = world_size
        self.num_passes = num_passes
        self.max_error_count = max_error_count
        self.max_seq_len = max_seq_len
        self.overlong = overlong
        # Position in the current pass.
        self._epoch = 0
        self._position = 0
        self._draws = 0
        self._stream_done = False
        self._hf_state: dict[str, Any] | None = None
        self._buffer: list[_Document] = []
        self._counters = {_ERRORS: 0, _TRUNCATED: 0, _DROPPED: 0}
        self._first_failure: str | None = None
        # The private copy of the stream being read in this pass (its state is live).
        self._live: Any = None
        self._block_key: tuple[int, int, int] | None = None
        self._block: np.ndarray | None = None

    # -- contract -------------------------------------------------------------------------
    @property
    def dataset_name(self) -> str:
        return self._name

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_hf_state"] = self._current_hf_state()
        state["_live"] = None
        state["_buffer"] = list(self._buffer)
        state["_block_key"] = state["_block"] = None
        return state

    def _current_hf_state(self) -> dict[str, Any] | None:
        """The ``datasets`` stream state at ``position`` (a fresh copy)."""
        if self._live is not None:
            return self._live.state_dict()
        return copy.deepcopy(self._hf_state)

    def state_dict(self) -> dict[str, Any]:
        shard = current_shard(self.rank, self.world_size)
        lengths = np.array([len(ids) for ids, _ in self._buffer], dtype=np.int64)
        has_mask = np.array([mask is not None for _, mask in self._buffer], dtype=bool)
        ids = np.concatenate([ids for ids, _ in self._buffer]) if self._buffer else np.zeros(0, np.int64)
        masks = [mask for _, mask in self._buffer if mask is not None]
        mask = np.concatenate(masks) if masks else np.zeros(0, bool)
        return {
            self._name: {
                _EPOCH: self._epoch,
                _POSITION: self._position,
                _DRAWS: self._draws,
                _STREAM_DONE: self._stream_done,
                _HF_STATE: self._current_hf_state(),
                _BUFFER_SIZE: self.shuffle_buffer_size,
                # The buffer's documents cannot be re-read by reference from a stream, so their tokens
                # stay in the state (plain lists): at most shuffle_buffer_size documents per shard.
                _BUFFER_LENGTHS: lengths.tolist(),
                _BUFFER_INPUT_IDS: ids.tolist(),
                _BUFFER_HAS_MASK: has_mask.tolist(),
                _BUFFER_LOSS_MASK: mask.tolist(),
                _NUM_SHARDS: shard.num_shards,
                _SHARD_ID: shard.shard_id,
                **self._counters,
            }
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        own = self._own_state(state_dict)
        shard = current_shard(self.rank, self.world_size)
        if own[_NUM_SHARDS] != shard.num_shards or own[_SHARD_ID] != shard.shard_id:
            raise ValueError(
                f"Source '{self._name}': the checkpoint was written by shard {own[_SHARD_ID]} of "
                f"{own[_NUM_SHARDS]} (world_size x num_workers) but this is shard {shard.shard_id} of "
                f"{shard.num_shards}. Resume with the same world size and num_workers."
            )
        if own[_BUFFER_SIZE] != self.shuffle_buffer_size:
            raise ValueError(
                f"Source '{self._name}': the checkpoint was written with a shuffle buffer of "
                f"{own[_BUFFER_SIZE]} documents (0 = no shuffle) but this source has "
                f"{self.shuffle_buffer_size}. Resume with the same shuffle and shuffle_buffer_size."
            )
        lengths = np.asarray(own[_BUFFER_LENGTHS], dtype=np.int64)
        has_mask = np.asarray(own[_BUFFER_HAS_MASK], dtype=bool)
        ids = np.asarray(own[_BUFFER_INPUT_IDS], dtype=np.int64)
        masks = np.asarray(own[_BUFFER_LOSS_MASK], dtype=bool)
        if int(lengths.sum()) != len(ids) or len(has_mask) != len(lengths):
            raise ValueError(
                f"Source '{self._name}': the saved shuffle buffer is inconsistent; the state is corrupt."
            )
        buffer: list[_Document] = []
        id_offset = mask_offset = 0
        for length, flagged in zip(lengths.tolist(), has_mask.tolist()):
            doc_ids = ids[id_offset : id_offset + length]
            id_offset += length
            doc_mask = None
            if flagged:
                doc_mask = masks[mask_offset : mask_offset + length]
                mask_offset += length
            buffer.append((doc_ids, doc_mask))
        self._epoch = int(own[_EPOCH])
        self._position = int(own[_POSITION])
        self._draws = int(own[_DRAWS])
        self._stream_done = bool(own[_STREAM_DONE])
        self._hf_state = copy.deepcopy(own[_HF_STATE])
        self._buffer = buffer
        self._live = None
        for key in self._counters:
            self._counters[key] = int(own.get(key, 0))

    # -- shuffling ------------------------------------------------------------------------
    def _draw_index(self, shard: ShardInfo, size: int) -> int:
        """Next uniform index in ``[0, size)``; the generator state is ``(epoch, draws)``."""
        block, offset = divmod(self._draws, _DRAW_BLOCK)
        key = (self._epoch, block, shard.shard_id)
        if self._block_key != key:
            entropy = [self.seed, _name_key(self._name), shard.shard_id, shard.num_shards, self._epoch, block]
            self._block = np.random.default_rng(entropy).random(_DRAW_BLOCK)
            self._block_key = key
        self._draws += 1
        return min(int(self._block[offset] * size), size - 1)

    # -- reading --------------------------------------------------------------------------
    def _document(self, row: dict[str, Any]) -> _Document:
        """Turn one stream row (a batch of one) into a document; raises on bad data."""
        failure = row.get(_PREPROCESS_ERROR, [None])[0]
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

    def _read(self, row: dict[str, Any], index: int) -> _Document | None:
        """``_document`` under the error budget and the overlong policy; ``None`` means skip."""
        try:
            ids, mask = self._document(row)
        except Exception:  # noqa: BLE001 - bad rows are counted and re-raised past the budget
            self._counters[_ERRORS] += 1
            if self._first_failure is None:
                self._first_failure = f"pass {self._epoch}, stream row {index}:\n{traceback.format_exc()}"
            if self._counters[_ERRORS] > self.max_error_count:
                raise RuntimeError(
                    f"Source '{self._name}': {self._counters[_ERRORS]} rows could not be read into documents, "
                    f"more than max_error_count={self.max_error_count}. First failure at "
                    f"{self._first_failure}Fix the preprocess function or raise max_error_count on this source."
                ) from None
            return None
        if self.max_seq_len is not None and len(ids) > self.max_seq_len:
            if self.overlong == "drop":
                self._counters[_DROPPED] += 1
                return None
            self._counters[_TRUNCATED] += 1
            ids = ids[: self.max_seq_len]
            mask = None if mask is None else mask[: self.max_seq_len]
        return ids, mask

    def _pass_documents(self, shard: ShardInfo) -> Iterator[_Document]:
        """This shard's documents for the rest of the current pass, in stream order.

        ``position`` (and the live stream state) advance a whole group of ``num_shards`` rows
        before the shard's row of that group is handed out, so the state seen at any yield
        describes exactly the rows consumed.
        """
        if self._position % shard.num_shards:
            raise ValueError(
                f"Source '{self._name}': saved position {self._position} is not a multiple of the "
                f"{shard.num_shards} shards; the state was written with a different sharding."
            )
        group_state = self._hf_state  # the stream's state at `position` (where a retry restarts)
        live, rows = self._open(group_state)
        retries = 0
        first_failure_at = 0.0
        while True:
            group: list[dict[str, Any]] = []
            try:
                with without_datasets_read_retries():
                    while len(group) < shard.num_shards:
                        group.append(next(rows))
            except StopIteration:
                self._live = None
                self._hf_state = None
                self._stream_done = True
                return
            except Exception as exc:
                row = self._position + len(group)
                if not _is_transient(exc):
                    raise RuntimeError(
                        f"Source '{self._name}': the datasets stream ({_stream_files(self._dataset)}) failed at "
                        f"row {row} of pass {self._epoch} ({type(exc).__name__}: {exc}). Errors inside the stream "
                        "(e.g. the preprocess .map) end it and cannot be skipped; fix the preprocess function."
                    ) from exc
                now = time.monotonic()
                first_failure_at = now if retries == 0 else first_failure_at
                delay = min(self.retry_backoff_s * 2**retries, _MAX_BACKOFF_S)
                out_of_time = now + delay - first_failure_at > self.retry_timeout_s
                if retries >= self.max_retries or out_of_time:
                    limit = (f"retry_timeout_s={self.retry_timeout_s:g} would be exceeded" if out_of_time
                             and retries < self.max_retries else f"max_retries={self.max_retries}")
                    raise RuntimeError(
                        f"Source '{self._name}': reading the stream from {_stream_files(self._dataset)} failed at "
                        f"row {row} of pass {self._epoch} with {type(exc).__name__}: {exc}, and kept failing "
                        f"after {retries} re-opens with backoff ({limit}) over {now - first_failure_at:.1f}s. "
                        "Check the server/network and the URL, or raise max_retries / retry_backoff_s / "
                        "retry_timeout_s."
                    ) from exc
                retries += 1
                log.warning(
                    "Source '%s': reading %s failed at row %d (%s: %s); re-opening at that row in %.2fs "
                    "[%d/%d].", self._name, _stream_files(self._dataset), row, type(exc).__name__, exc, delay,
                    retries, self.max_retries,
                )
                time.sleep(delay)
                live, rows = self._open(group_state)
                continue
            retries = 0
            index = self._position + shard.shard_id
            self._position += shard.num_shards
            group_state = live.state_dict()
            document = self._read(group[shard.shard_id], index)
            if document is not None:
                yield document

    def _open(self, state: dict[str, Any] | None) -> tuple[Any, Iterator[dict[str, Any]]]:
        """A private copy of the stream positioned at ``state`` (``None``: the pass start)."""
        live = copy.deepcopy(self._dataset)  # private copy: its pipeline state is ours alone
        if state is not None:
            live.load_state_dict(state)
        self._live = live
        return live, live.iter(batch_size=1)  # unlike iter(live), never splits itself by worker

    def _sample(self, document: _Document) -> dict[str, Any]:
        ids, mask = document
        sample: dict[str, Any] = {INPUT_IDS: ids, SOURCE: self._name, EPOCH: self._epoch}
        if mask is not None:
            sample[LOSS_MASK] = mask
        return sample

    def __iter__(self) -> Iterator[dict[str, Any]]:
        shard = current_shard(self.rank, self.world_size)
        while self.num_passes is None or self._epoch < self.num_passes:
            fresh_pass = self._position == 0 and not self._stream_done and not self._buffer
            yielded = 0
            if not self._stream_done:
                for document in self._pass_documents(shard):
                    if len(self._buffer) < self.shuffle_buffer_size:
                        self._buffer.append(document)
                        continue
                    if self.shuffle_buffer_size:
                        index = self._draw_index(shard, len(self._buffer))
                        document, self._buffer[index] = self._buffer[index], document
                    yielded += 1
                    yield self._sample(document)
            while self._buffer:  # drain: the rest of this pass, in random order
                index = self._draw_index(shard, len(self._buffer))
                document = self._buffer[index]
                self._buffer[index] = self._buffer[-1]
                self._buffer.pop()
                yielded += 1
                yield self._sample(document)
            if fresh_pass and yielded == 0:
                raise RuntimeError(
                    f"Source '{self._name}': a full pass over shard {shard.shard_id} of {shard.num_shards} "
                    f"({self._position} stream rows read) produced no samples (failed: "
                    f"{self._counters[_ERRORS]}, overlong dropped: {self._counters[_DROPPED]}). The stream "
                    f"needs at least {shard.num_shards} rows (world_size={shard.world_size} x "
                    f"num_workers={shard.num_workers}); check the data, the preprocess function and the "
                    "overlong policy."
                )
            self._epoch += 1
            self._position = 0
            self._draws = 0
            self._stream_done = False
            self._hf_state = None
