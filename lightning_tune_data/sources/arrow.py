"""``ArrowSource``: an infinite, sharded, exactly and elastically resumable stream over a cached Arrow dataset.

Mental model: the cache is a memory-mapped Arrow table of tokenized documents. Pass ``e`` over
the source visits positions ``0..n-1`` in the order of a keyed permutation of
``(seed, source name, e)`` that is computed per position, never stored (``permutation.py``), so
memory and start-up do not grow with the number of rows. The ``world_size × num_workers``
shards split each pass by striding over the positions (``pass_order.py``): no two shards read
the same row in a pass, every shard reads the same number of rows, and the
``num_rows % num_shards`` rows left over are skipped in that pass (a different set every pass
when shuffling, the last rows of the file when not).

The state is a handful of integers per shard (pass, positions visited, and after a resume with a
different layout a short list of positions still owed), plus counters. It is the same size at
step 10 and at step 10 million, and it can be merged across shards and re-split for another
number of ranks or workers (see :meth:`ArrowSource.merge_shard_states`).

Rows are read as zero-copy NumPy views into the memory-mapped ``input_ids`` column. A packer
reads blocks of documents instead (:meth:`ArrowSource.read_block`): each document is then its
row reference and the position of its first token in one flat view of the column's values, with
no Python object per document until a batch is collated.

The source is composed of one part per concern, each with its own state: the table's columns
and the rows of a pass (:class:`~lightning_tune_data.sources.arrow_rows.ArrowRows`), the shard's
position, counters and saved forms (:class:`~lightning_tune_data.sources.arrow_state.ArrowSourceState`),
the length policy (:class:`~lightning_tune_data.sources.length_policy.LengthPolicy`) and the user's
transforms (:class:`~lightning_tune_data.sources.sample_transforms.SampleTransforms`); iteration is
:func:`~lightning_tune_data.sources.arrow_iteration.shard_documents`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from lightning_tune_data.distributed import ShardInfo, current_shard
from lightning_tune_data.keys import INPUT_IDS, OVERLONG_POLICIES, OverlongPolicy
from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.arrow_iteration import ROWS_PER_STEP, shard_documents
from lightning_tune_data.sources.arrow_columns import FlatColumn
from lightning_tune_data.sources.arrow_rows import ArrowRows
from lightning_tune_data.sources.arrow_state import ArrowSourceState
from lightning_tune_data.sources.base import TuneIterableDataset
from lightning_tune_data.sources.document_block import DocumentBlock
from lightning_tune_data.sources.length_policy import LengthPolicy
from lightning_tune_data.sources.sample_transforms import SampleTransforms
from lightning_tune_data.sources.source_state import SourceCounters
from lightning_tune_data.sources.stream_arguments import settings_property, stream_settings

__all__ = ["ArrowSource"]


class ArrowSource(TuneIterableDataset):
    """Infinite, sharded, deterministic, resumable stream of documents from an Arrow dataset.

    Args:
        dataset: a ``datasets.Dataset`` (memory-mapped cache) or ``pyarrow.Table`` with an
            ``input_ids`` list column and optionally a ``loss_mask`` list column.
        dataset_name: the source's name; namespaces state and metrics (the manager name).
        seed: base seed; pass ``e`` uses the permutation keyed by ``(seed, name, e)``.
        shuffle: permute rows every pass; ``False`` keeps file order.
        rank, world_size: the DDP coordinates, captured in the main process.
        num_passes: stop after this many passes; ``None`` (default) means infinite.
        message_transform, model_transform, output_transform: optional per-sample callables
            applied in that order to each document sample. They must be deterministic: a
            resume re-reads documents held in open packs and transforms them again.
        filter_fn: optional predicate ``filter_fn(sample, **filter_kwargs) -> bool``; ``False``
            skips the sample.
        filter_kwargs: keyword arguments for ``filter_fn``.
        max_error_count: how many samples whose transforms raise may be skipped (and counted)
            before iteration fails with the first failure's traceback and row.
        max_seq_len: with ``overlong``, the policy for documents longer than this.
        overlong: ``"truncate"`` (keep the first ``max_seq_len`` tokens) or ``"drop"``; both are
            counted, and each yielded document says how many tokens it lost
            (``truncated_tokens``) and how many documents were dropped before it
            (``dropped_before``).
        settings: the run's settings, instead of ``seed``, ``rank``, ``world_size``,
            ``num_passes``, ``max_seq_len`` and ``overlong`` (which then keep their defaults).

    Empty documents are skipped and counted (``empty_skipped``); a pass that yields nothing
    raises an error naming the source and the shard instead of looping forever.
    """

    seed = settings_property("seed")
    rank = settings_property("rank")
    world_size = settings_property("world_size")
    num_passes = settings_property("num_passes")
    max_seq_len = settings_property("max_seq_len")
    overlong = settings_property("overlong")
    shuffle = property(operator.attrgetter("_rows.shuffle"), doc="Whether every pass permutes the rows.")
    max_error_count = property(operator.attrgetter("_transforms.budget.max_error_count"),
                               doc="Samples whose transforms raise that may be skipped.")

    def __init__(
        self,
        dataset: Any,
        dataset_name: str,
        seed: int = 0,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
        num_passes: int | None = None,
        message_transform: Callable[[dict], dict] | None = None,
        model_transform: Callable[[dict], dict] | None = None,
        output_transform: Callable[[dict], dict] | None = None,
        filter_fn: Callable[..., bool] | None = None,
        filter_kwargs: dict[str, Any] | None = None,
        max_error_count: int = 0,
        max_seq_len: int | None = None,
        overlong: OverlongPolicy = "truncate",
        settings: StreamSettings | None = None,
    ) -> None:
        if overlong not in OVERLONG_POLICIES:
            raise ValueError(f"Source '{dataset_name}': overlong={overlong!r}; use one of {OVERLONG_POLICIES}.")
        if num_passes is not None and num_passes < 1:
            raise ValueError(f"Source '{dataset_name}': num_passes must be >= 1 or None, got {num_passes}.")
        self.settings = stream_settings(settings, dataset_name, seed=int(seed), rank=rank, world_size=world_size,
                                        num_passes=num_passes, max_seq_len=max_seq_len, overlong=overlong)
        self._name = dataset_name
        self._rows = ArrowRows(dataset, dataset_name, self.settings, shuffle)
        counters = SourceCounters()  # one object: every part below counts into it
        self._transforms = SampleTransforms(dataset_name, (message_transform, model_transform, output_transform),
                                            filter_fn, filter_kwargs, max_error_count, counters)
        self._lengths = LengthPolicy(self.settings, counters)
        self._state = ArrowSourceState(dataset_name, self._rows.num_rows, self.settings, counters, self._rows)
        self._block_pass: list[Any] | None = None  # read_block's [pass, documents read, counters at its start]
        self._flat_view: tuple[memoryview, np.dtype] | None = None

    # -- contract -------------------------------------------------------------------------
    @property
    def dataset_name(self) -> str:
        """The source's name (the manager name)."""
        return self._name

    @property
    def num_rows(self) -> int:
        """Rows of the source (all shards together)."""
        return self._rows.num_rows

    @property
    def counters(self) -> dict[str, int]:
        """What this shard skipped so far, by reason (see :class:`SourceCounters`)."""
        return self._state.counters.state_dict()

    def rows_per_shard(self, shard: ShardInfo) -> int:
        """Rows each shard visits per pass of its layout (the same for every shard).

        Args:
            shard: any shard of the layout.
        """
        return self._rows.num_rows // shard.num_shards

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_flat_view"] = None  # a memoryview: made again where it is used
        return state

    def state_dict(self) -> dict[str, Any]:
        """``{name: {"walk": ..., "counters": ...}}`` after the last document handed out."""
        return self._state.state_dict()

    def snapshot(self) -> Callable[[], dict[str, Any]]:
        """A record of the position after the last document handed out, taken in a few
        microseconds; calling it returns :meth:`state_dict`'s result for that position. The train
        loader takes one after every batch and builds the state only when a checkpoint asks."""
        return self._state.snapshot()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict` result of this shard."""
        self._state.load_state_dict(self._own_state(state_dict))

    def merge_shard_states(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        """What every old shard left unread, from all their states (for a resume with another layout).

        Args:
            states: one :meth:`state_dict` per old shard.
        """
        return self._state.merge([self._own_state(state) for state in states])

    def load_global_state(self, global_state: dict[str, Any]) -> None:
        """Continue from a :meth:`merge_shard_states` result; this shard takes its share on first use."""
        self._state.load_global(self._own_state(global_state))

    # -- reading --------------------------------------------------------------------------
    def read_document(self, source: str, row: int, epoch: int) -> dict[str, Any] | None:
        """Document ``row`` as this source yields it in pass ``epoch`` (``None`` if it is not ours).

        Args:
            source: the name of the document's source.
            row: its row.
            epoch: the pass it was read in.
        """
        if source != self._name:
            return None
        self._rows.open()
        sample = self._rows.document(int(row), int(epoch))
        if not self._transforms.plain:
            sample = self._transforms.apply(sample, int(row), count=False)
            if sample is None:
                return None
        return self._lengths.apply(sample, count=False)

    # -- blocks of document references (the packer's fast path) ------------------------------
    def blocks_supported(self) -> bool:
        """Whether :meth:`read_block` may be used: no transforms, no filter, no loss mask column."""
        self._rows.open()
        return self._transforms.plain and self._rows.loss_mask is None

    def read_block(self, limit: int = ROWS_PER_STEP) -> DocumentBlock | None:
        """The next up to ``limit`` documents of this shard, exactly as iteration would yield them.

        Advances the state past them (the caller holds the block until it has used it), applies
        the length policy and counts what it skips, like :meth:`__iter__`. ``None``: the last
        pass (``num_passes``) is over. Only when :meth:`blocks_supported`.

        Args:
            limit: the most rows read (documents the length policy skips among them are counted).
        """
        settings, state, rows = self.settings, self._state, self._rows
        shard = current_shard(settings.rank, settings.world_size)
        if self.rows_per_shard(shard) == 0:
            raise ValueError(
                f"Source '{self._name}' has {rows.num_rows} rows, fewer than its {shard.num_shards} shards; lower "
                "num_workers or add data."
            )
        state.settle()
        walk = state.walk()
        rows.open()
        while settings.num_passes is None or walk.epoch < settings.num_passes:
            plan, epoch = walk.plan, walk.epoch
            if plan.untouched_fresh and len(plan) > 0:
                self._block_pass = [epoch, 0, state.counters.snapshot()]
            if plan.done:
                judge = self._block_pass
                if judge is not None and judge[0] == epoch and judge[1] == 0:
                    raise RuntimeError(
                        f"Source '{self._name}': a full pass over shard {shard.shard_id} of {shard.num_shards} ({len(plan)} "
                        f"rows) produced no usable document ({state.counters.since(judge[2])}). Check the data "
                        "(empty documents are skipped) and the overlong policy."
                    )
                walk.next_pass()
                continue
            upcoming = rows.upcoming(plan, limit)
            start_state = state.state_dict()
            plan.advance(len(upcoming))
            block = self._lengths.block(self._name, epoch, upcoming, rows.input_ids, start_state, self)
            if block is not None:
                if self._block_pass is not None and self._block_pass[0] == epoch:
                    self._block_pass[1] += len(block.rows)
                return block
        return None

    def flat_tokens(self) -> np.ndarray:
        """The ``input_ids`` column's values as one flat array (what a block's positions index;
        for a store read shard by shard, an object whose slices are arrays)."""
        self._rows.open()
        flat = self._rows.input_ids.flat()
        if flat is None:
            raise TypeError(f"Source '{self._name}': the '{INPUT_IDS}' values are not null-free integers.")
        return flat.values

    def flat_view(self) -> tuple[Any, np.dtype]:
        """:meth:`flat_tokens` as a memoryview (slices of one, for a store read shard by shard),
        and its dtype (made once per process: the packed collator joins every batch's rows from it)."""
        if self._flat_view is None:
            self._rows.open()
            flat = self._rows.input_ids.flat()
            if isinstance(flat, FlatColumn) or flat is None:
                tokens = self.flat_tokens()
                self._flat_view = (memoryview(tokens), tokens.dtype)
            else:
                self._flat_view = (flat.views, flat.dtype)
        return self._flat_view

    def released_shards(self) -> set[int]:
        """The shards of a store read shard by shard that this reader let go of since the last
        call: a packer copies out the pieces it holds of them (empty for other stores)."""
        return self._rows.take_released()

    def copied_out(self) -> None:
        """The packer copied out its held pieces of :meth:`released_shards`: the mappings of
        shards this reader does not read now go, so they do not hold the node's cache."""
        self._rows.copied_out()

    def state_after_block(self, block: DocumentBlock, documents: int) -> dict[str, Any]:
        """This source's state right after the first ``documents`` documents of ``block``.

        The rows read for the block after that document are unread again in this state (a
        resume reads them again, counting what the length policy skips among them then).

        Args:
            block: a block returned by :meth:`read_block` of this source.
            documents: how many of the block's documents have been used (0 to all of them).
        """
        return self._state.after_block(block, documents)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return shard_documents(self._name, self.settings, self._state, self._rows, self._transforms, self._lengths)
