"""Reading an ``ArrowSource`` shard one document at a time: what iterating the source yields.

Rows are read ``ROWS_PER_STEP`` at a time as zero-copy views. A document within the limits and
with no transform, filter or loss mask is handed out as read; the others go through the
transforms and the length policy. The shard's position advances lazily (see
:class:`~lightning_tune_data.sources.arrow_state.ArrowSourceState`).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from typing import Any

from lightning_tune_data.distributed import current_shard
from lightning_tune_data.keys import DROPPED_BEFORE, EPOCH, INPUT_IDS, LOSS_MASK, SOURCE, SOURCE_ROW
from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.arrow_rows import ArrowRows
from lightning_tune_data.sources.arrow_state import ArrowSourceState
from lightning_tune_data.sources.length_policy import LengthPolicy
from lightning_tune_data.sources.sample_transforms import SampleTransforms

__all__ = ["ROWS_PER_STEP", "shard_documents"]

#: Rows read per step of iteration (and per block by default).
ROWS_PER_STEP = 512


def shard_documents(name: str, settings: StreamSettings, state: ArrowSourceState, rows: ArrowRows,
                    transforms: SampleTransforms, lengths: LengthPolicy) -> Iterator[dict[str, Any]]:
    """The documents of this process's shard from its current position on (what ``iter(source)``
    yields), until the last pass (``settings.num_passes``) is over.

    Args:
        name: the source's name.
        settings: the run's settings.
        state: the shard's position and counters (advanced as documents are read).
        rows: the source's rows.
        transforms: the source's transforms and filter.
        lengths: the source's length policy.

    Raises:
        ValueError: the shard gets no rows (more shards than rows).
        RuntimeError: a full pass yields no document (everything empty, filtered or dropped).
    """
    shard = current_shard(settings.rank, settings.world_size)
    if rows.num_rows // shard.num_shards == 0:
        raise ValueError(
            f"Source '{name}' has {rows.num_rows} rows, fewer than its {shard.num_shards} shards "
            f"(world_size={shard.world_size} x num_workers={shard.num_workers}). Lower num_workers or "
            "add data."
        )
    state.settle()
    walk = state.walk()
    rows.open()
    plain = transforms.plain
    limit = settings.max_seq_len if settings.max_seq_len is not None else sys.maxsize
    while settings.num_passes is None or walk.epoch < settings.num_passes:
        plan, epoch = walk.plan, walk.epoch
        judged = plan.untouched_fresh and len(plan) > 0
        before = state.counters.snapshot()
        yielded = 0
        while not plan.done:
            upcoming = rows.upcoming(plan, ROWS_PER_STEP)
            row_list = upcoming.tolist()
            ids_block = rows.input_ids.rows(upcoming)
            # The plan advances lazily: the cursor counts the block's documents read so far (yielded or
            # skipped), and settle() applies them before anything looks at the state. While suspended
            # at a yield the state is the same as if the plan had advanced one document at a time.
            cursor = state.cursor = [plan, 0, 0]
            mask_block = None if rows.loss_mask is None else rows.loss_mask.rows(upcoming)
            quick = plain and mask_block is None  # a document within the limits is yielded as read
            for position, row, ids in zip(itertools.count(1), row_list, ids_block):
                cursor[1] = position
                if quick and 0 < len(ids) <= limit and not lengths.dropped_since_yield:
                    yielded += 1
                    yield {INPUT_IDS: ids, SOURCE: name, EPOCH: epoch, SOURCE_ROW: row}
                    continue
                sample = {INPUT_IDS: ids, SOURCE: name, EPOCH: epoch, SOURCE_ROW: row}
                if mask_block is not None:
                    sample[LOSS_MASK] = mask_block[position - 1].astype(bool, copy=False)
                if not plain:
                    sample = transforms.apply(sample, row)
                    if sample is None:
                        continue
                sample = lengths.apply(sample)
                if sample is None:
                    continue
                if lengths.dropped_since_yield:
                    sample[DROPPED_BEFORE] = lengths.dropped_since_yield
                    lengths.dropped_since_yield = 0
                yielded += 1
                yield sample
            cursor[1] = len(row_list)
            state.settle()
        if judged and yielded == 0:
            skipped = state.counters.since(before)
            raise RuntimeError(
                f"Source '{name}': a full pass over shard {shard.shard_id} of {shard.num_shards} "
                f"({len(plan)} rows) produced no usable document ({skipped}). Check the data (empty "
                "documents are skipped), filter_fn, the transforms and the overlong policy."
            )
        walk.next_pass()
