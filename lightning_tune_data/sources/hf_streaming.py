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

Parts
-----
The source composes the shard's reading of the stream
(:class:`~lightning_tune_data.sources.stream_reader.StreamReader`, with
:func:`~lightning_tune_data.sources.stream_reader.row_document`), the shuffle buffer
(:class:`~lightning_tune_data.sources.shuffle_buffer.ShuffleBuffer`) and the retry policy
(:class:`~lightning_tune_data.sources.retries.RetryPolicy`).
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterator
from typing import Any

from lightning_tune_data.distributed import current_shard
from lightning_tune_data.keys import EPOCH, INPUT_IDS, LOSS_MASK, OVERLONG_POLICIES, SOURCE, OverlongPolicy
from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.base import TuneIterableDataset
from lightning_tune_data.sources.error_budget import ErrorBudget
from lightning_tune_data.sources.retries import RetryPolicy
from lightning_tune_data.sources.shuffle_buffer import ShuffleBuffer, StreamDocument
from lightning_tune_data.sources.stream_arguments import settings_property, stream_settings
from lightning_tune_data.sources.stream_reader import StreamReader, check_stream, row_document

__all__ = ["HFStreamingSource"]

log = logging.getLogger(__name__)

# State keys (the shuffle buffer adds its own).
_EPOCH = "epoch"
_POSITION = "position"
_STREAM_DONE = "stream_done"
_HF_STATE = "hf_state"
_ERRORS = "errors"
_TRUNCATED = "overlong_truncated"
_DROPPED = "overlong_dropped"
_NUM_SHARDS = "num_shards"
_SHARD_ID = "shard_id"


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
        settings: the run's settings, instead of ``seed``, ``rank``, ``world_size``,
            ``num_passes``, ``max_seq_len`` and ``overlong`` (which then keep their defaults).
    """

    seed = settings_property("seed")
    rank = settings_property("rank")
    world_size = settings_property("world_size")
    num_passes = settings_property("num_passes")
    max_seq_len = settings_property("max_seq_len")
    overlong = settings_property("overlong")
    shuffle_buffer_size = property(operator.attrgetter("_buffer.size"), doc="Documents the shuffle buffer holds.")
    max_error_count = property(operator.attrgetter("_errors.max_error_count"), doc="Unreadable rows skipped at most.")
    max_retries = property(operator.attrgetter("_retries.max_retries"), doc="Re-opens in a row at most.")
    retry_backoff_s = property(operator.attrgetter("_retries.backoff_s"), doc="Wait before the first re-open.")
    retry_timeout_s = property(operator.attrgetter("_retries.timeout_s"), doc="Longest time retrying one failure.")

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
        overlong: OverlongPolicy = "truncate",
        max_retries: int = 3,
        retry_backoff_s: float = 1.0,
        retry_timeout_s: float = 300.0,
        settings: StreamSettings | None = None,
    ) -> None:
        check_stream(dataset, dataset_name)
        if overlong not in OVERLONG_POLICIES:
            raise ValueError(f"Source '{dataset_name}': overlong={overlong!r}; use one of {OVERLONG_POLICIES}.")
        if num_passes is not None and num_passes < 1:
            raise ValueError(f"Source '{dataset_name}': num_passes must be >= 1 or None, got {num_passes}.")
        if shuffle and shuffle_buffer_size < 1:
            raise ValueError(
                f"Source '{dataset_name}': shuffle_buffer_size must be >= 1 when shuffling, got "
                f"{shuffle_buffer_size}. Use shuffle=False to read in stream order."
            )
        self.settings = stream_settings(settings, dataset_name, seed=int(seed), rank=rank, world_size=world_size,
                                        num_passes=num_passes, max_seq_len=max_seq_len, overlong=overlong)
        if self.settings.seed < 0:
            raise ValueError(f"Source '{dataset_name}': seed must be >= 0, got {self.settings.seed}.")
        if self.settings.max_seq_len is not None and self.settings.max_seq_len < 1:
            raise ValueError(
                f"Source '{dataset_name}': max_seq_len must be >= 1 or None, got {self.settings.max_seq_len}."
            )
        self._retries = RetryPolicy(dataset_name, max_retries, retry_backoff_s, retry_timeout_s)
        self._name = dataset_name
        self.shuffle = shuffle
        self._buffer = ShuffleBuffer(dataset_name, int(shuffle_buffer_size) if shuffle else 0, self.settings)
        self._errors = ErrorBudget(dataset_name, max_error_count, "rows could not be read into documents",
                                   "Fix the preprocess function or raise max_error_count on this source.")
        self._stream = StreamReader(dataset, dataset_name, self._retries, log)  # the position in the pass
        self._epoch = 0
        self._counters = {_ERRORS: 0, _TRUNCATED: 0, _DROPPED: 0}

    # -- contract -------------------------------------------------------------------------
    @property
    def dataset_name(self) -> str:
        """The source's name (the manager name)."""
        return self._name

    def state_dict(self) -> dict[str, Any]:
        """The pass, the stream position and state, the shuffle buffer's documents and the counters."""
        shard = current_shard(self.settings.rank, self.settings.world_size)
        return {
            self._name: {
                _EPOCH: self._epoch,
                _POSITION: self._stream.position,
                _STREAM_DONE: self._stream.stream_done,
                _HF_STATE: self._stream.hf_state(),
                **self._buffer.state_dict(),
                _NUM_SHARDS: shard.num_shards,
                _SHARD_ID: shard.shard_id,
                **self._counters,
            }
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` result of this shard (same layout and buffer size)."""
        own = self._own_state(state_dict)
        shard = current_shard(self.settings.rank, self.settings.world_size)
        if own[_NUM_SHARDS] != shard.num_shards or own[_SHARD_ID] != shard.shard_id:
            raise ValueError(
                f"Source '{self._name}': the checkpoint was written by shard {own[_SHARD_ID]} of "
                f"{own[_NUM_SHARDS]} (world_size x num_workers) but this is shard {shard.shard_id} of "
                f"{shard.num_shards}. Resume with the same world size and num_workers."
            )
        self._buffer.load_state_dict(own)
        self._epoch = int(own[_EPOCH])
        self._stream.restore(int(own[_POSITION]), bool(own[_STREAM_DONE]), own[_HF_STATE])
        for key in self._counters:
            self._counters[key] = int(own.get(key, 0))

    # -- reading --------------------------------------------------------------------------
    def _read(self, row: dict[str, Any], index: int) -> StreamDocument | None:
        """:func:`row_document` under the error budget and the overlong policy; ``None`` means skip."""
        try:
            ids, mask = row_document(row)
        except Exception:  # noqa: BLE001 - bad rows are counted and re-raised past the budget
            self._counters[_ERRORS] += 1
            self._errors.charge(self._counters[_ERRORS], f"pass {self._epoch}, stream row {index}")
            return None
        cap = self.settings.max_seq_len
        if cap is not None and len(ids) > cap:
            if self.settings.overlong == "drop":
                self._counters[_DROPPED] += 1
                return None
            self._counters[_TRUNCATED] += 1
            ids = ids[:cap]
            mask = None if mask is None else mask[:cap]
        return ids, mask

    def _sample(self, document: StreamDocument) -> dict[str, Any]:
        ids, mask = document
        sample: dict[str, Any] = {INPUT_IDS: ids, SOURCE: self._name, EPOCH: self._epoch}
        if mask is not None:
            sample[LOSS_MASK] = mask
        return sample

    def __iter__(self) -> Iterator[dict[str, Any]]:
        shard = current_shard(self.settings.rank, self.settings.world_size)
        buffer, stream = self._buffer, self._stream
        while self.settings.num_passes is None or self._epoch < self.settings.num_passes:
            fresh_pass = stream.position == 0 and not stream.stream_done and not buffer.documents
            yielded = 0
            if not stream.stream_done:
                for stream_row, row in stream.rows(shard, self._epoch):
                    document = self._read(row, stream_row)
                    if document is None:
                        continue
                    if len(buffer.documents) < buffer.size:
                        buffer.documents.append(document)
                        continue
                    if buffer.size:
                        index = buffer.draw_index(self._epoch, shard)
                        document, buffer.documents[index] = buffer.documents[index], document
                    yielded += 1
                    yield self._sample(document)
            while buffer.documents:  # drain: the rest of this pass, in random order
                index = buffer.draw_index(self._epoch, shard)
                document = buffer.documents[index]
                buffer.documents[index] = buffer.documents[-1]
                buffer.documents.pop()
                yielded += 1
                yield self._sample(document)
            if fresh_pass and yielded == 0:
                raise RuntimeError(
                    f"Source '{self._name}': a full pass over shard {shard.shard_id} of {shard.num_shards} "
                    f"({stream.position} stream rows read) produced no samples (failed: "
                    f"{self._counters[_ERRORS]}, overlong dropped: {self._counters[_DROPPED]}). The stream "
                    f"needs at least {shard.num_shards} rows (world_size={shard.world_size} x "
                    f"num_workers={shard.num_workers}); check the data, the preprocess function and the "
                    "overlong policy."
                )
            self._epoch += 1
            stream.next_pass()
            buffer.draws = 0
