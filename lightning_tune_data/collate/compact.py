"""Compact train batches: what a dataloader worker sends when the rest can be derived after transfer.

A full packed batch is five ``[B, L]`` int64 planes (``input_ids``, ``labels``, ``position_ids``,
``document_ids``, ``attention_mask``), but only the token ids and the documents' lengths carry
information: the other four follow from them. A *compact* batch carries

* ``input_ids`` as int32 when every id (and ``pad_id``) fits, else int64;
* ``seq_lens`` (packed) or ``row_lengths`` (padded: one document per row);
* ``target_mask`` (``[B, L]`` bool, ``True`` where the label is a target) only when some document
  of the batch masks targets (a prompt); otherwise every token but a document's last is a target;
* ``provenance``, exactly as a full batch has it, and ``compact_layout`` (``"packed"`` or ``"padded"``).

That is 4-10x fewer bytes through the worker's queue and the host-to-device copy (8 bytes per
token become 4, or 5 with a mask). From a dataloader worker the parts travel as NumPy arrays
pickled inline (:func:`~lightning_tune_data.collate.worker_memory.batch_parts`), which the train
loader wraps as tensors (:func:`compact_tensors`).
:func:`~lightning_tune_data.collate.expand.expand_batch` derives the full batch, bit for bit the one
the collator would have written, after the batch reached its device
(``TextDataModule.on_after_batch_transfer``).

Anything unusual (token ids that do not fit, an id equal to the ignore label, per-token fields of
hand-made samples) gets a full batch instead: the expansion passes full batches through.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from lightning_tune_data.collate.worker_memory import batch_parts
from lightning_tune_data.keys import (
    COMPACT_LAYOUT,
    IGNORE_INDEX,
    INPUT_IDS,
    PROVENANCE,
    ROW_LENGTHS,
    SEQ_LENS,
    TARGET_MASK,
    TARGET_TOKENS,
)
from lightning_tune_data.packing.pack import Pack
from lightning_tune_data.packing.rows import write_rows

__all__ = ["compact_ids_dtype", "compact_packed_batch", "compact_packs", "compact_padded_batch", "compact_tensors"]

_INT32_LOW, _INT32_HIGH = -(1 << 31), (1 << 31) - 1


def compact_ids_dtype(values: np.ndarray, pad_id: int) -> np.dtype | None:
    """The dtype a compact batch carries ``values`` (token ids) in: int32 when they and ``pad_id``
    fit, else int64; ``None`` when a value equals the ignore label (``-100``), whose labels only a
    full batch reproduces exactly.

    Args:
        values: the batch's token ids (any integer dtype).
        pad_id: the padding id written next to them.
    """
    dtype = values.dtype
    narrow = dtype.itemsize < 4 or dtype == np.int32  # holds no value beyond int32
    if not values.size:
        low, high = 0, 0
    elif dtype.kind == "u":
        low, high = 0, (0 if narrow else int(values.max()))
    else:
        low, high = int(values.min()), (0 if narrow else int(values.max()))
    if low <= IGNORE_INDEX:
        return None
    fits = high <= _INT32_HIGH and _INT32_LOW <= pad_id <= _INT32_HIGH
    return np.dtype(np.int32) if fits else np.dtype(np.int64)


def compact_tensors(batch: Any) -> Any:
    """A compact batch from a dataloader worker with its NumPy arrays wrapped as tensors (no copy);
    any other batch as is.

    Compact batches are never pinned, even with ``pin_memory``: pinning would copy them in the main
    process, and they are a tenth of a full batch, so the copy to the GPU is short either way (on an
    H200, a GPU-bound run trained at 1.04x the speed of pinned full batches with compact batches not
    pinned, and at 0.96x with them pinned: ``benchmarks/bench_device.py``).

    Args:
        batch: what the worker sent.
    """
    if type(batch) is not dict or COMPACT_LAYOUT not in batch:
        return batch
    for key, value in batch.items():
        if isinstance(value, np.ndarray):
            batch[key] = torch.from_numpy(value)
    return batch


def compact_packed_batch(ids: np.ndarray, seq_lens: np.ndarray, target: np.ndarray | None,
                         provenance: dict[str, list[Any]]) -> dict[str, Any]:
    """A compact packed batch of its arrays: tensors sharing their memory in the main process, the
    arrays themselves in a dataloader worker (pickled inline on the way out; see
    :mod:`~lightning_tune_data.collate.worker_memory`).

    Args:
        ids: ``[B, L]`` token ids, padded, in the dtype they travel in (:func:`compact_ids_dtype`).
        seq_lens: ``[B, D]`` int64, the documents' lengths row by row, each row zero-padded.
        target: ``[B, L]`` bool, ``True`` where the label is a target, or ``None`` (no document
            masks targets).
        provenance: the batch's provenance, as a full batch has it.
    """
    wrap = torch.from_numpy if get_worker_info() is None else _as_is
    batch: dict[str, Any] = {COMPACT_LAYOUT: "packed", INPUT_IDS: wrap(ids), SEQ_LENS: wrap(seq_lens)}
    if target is not None:
        batch[TARGET_MASK] = wrap(target)
    batch[PROVENANCE] = provenance
    return batch


def _as_is(array: np.ndarray) -> np.ndarray:
    return array


def compact_padded_batch(tokens: np.ndarray, dtype: np.dtype, lengths: Sequence[int], width: int, pad_id: int,
                         real: np.ndarray, targets: np.ndarray | None, provenance: dict[str, list[Any]]) -> dict[str, Any]:
    """A compact padded batch (one document per row) in one buffer.

    Args:
        tokens: the documents' token ids, concatenated.
        dtype: the dtype to carry them in (:func:`compact_ids_dtype`).
        lengths: each row's real tokens.
        width: tokens per row.
        pad_id: the id written after each row's tokens.
        real: ``[B, width]`` bool, ``True`` on real tokens (where ``tokens`` go, row-major).
        targets: ``[B, width]`` bool, ``True`` where the *token* is a target (real and not masked),
            or ``None`` when no document has a mask.
        provenance: the batch's provenance, as a full batch has it.
    """
    rows = len(lengths)
    parts = [((rows, width), dtype), ((rows,), np.int64)]
    if targets is not None:
        parts.append(((rows, width), np.bool_))
    arrays, tensors = batch_parts(parts)
    ids = arrays[0]
    ids.fill(pad_id)
    ids[real] = tokens
    arrays[1][:] = lengths
    batch: dict[str, Any] = {COMPACT_LAYOUT: "padded", INPUT_IDS: tensors[0], ROW_LENGTHS: tensors[1]}
    if targets is not None:
        label_targets = arrays[2]
        label_targets[:, :-1] = targets[:, 1:]  # the label at i is token i + 1: a target where that token is
        label_targets[:, width - 1:] = False
        batch[TARGET_MASK] = tensors[2]
    batch[PROVENANCE] = provenance
    return batch


def compact_packs(packs: Sequence[Pack], width: int, pad_id: int, lens: Sequence[int], sources: Sequence[str],
                  seq_lens_values: Sequence[int], most: int, provenance: dict[str, list[Any]]) -> dict[str, Any] | None:
    """The compact batch of the packer's own packs, or ``None`` when only a full batch is exact
    (an id equal to the ignore label). The rows are joined as for a full batch, and carried as
    joined when they are int32 already (no copy); a target mask is written only when a piece
    carries its own labels (a masked document).

    Args:
        packs: the batch's packs (the packer's own), one per row.
        width: tokens per row.
        pad_id: the id written after each pack's tokens.
        lens, sources: every piece's length and source name, packs back to back.
        seq_lens_values: the pieces' lengths, row by row, each row zero-padded to ``most``.
        most: the most pieces in a row.
        provenance: the batch's provenance without ``target_tokens`` (added here).
    """
    rows = len(packs)
    values = write_rows(packs, width, pad_id, None, lens, sources)  # the joined rows (writable), or int64 ones
    dtype = compact_ids_dtype(values, pad_id)
    if dtype is None:
        return None
    ids = (values if values.dtype == dtype else values.astype(dtype)).reshape(rows, width)
    target = _target_mask(packs, width, lens) if any(pack.extras is not None for pack in packs) else None
    if target is None:
        provenance[TARGET_TOKENS] = [length - 1 for length in lens]  # no id is the ignore label
    else:
        piece_starts = _piece_starts(packs, width, lens)
        provenance[TARGET_TOKENS] = np.add.reduceat(target.view(np.uint8), piece_starts, dtype=np.int64).tolist()
        target = target.reshape(rows, width)
    seq_lens = np.array(seq_lens_values, dtype=np.int64).reshape(rows, most)
    return compact_packed_batch(ids, seq_lens, target, provenance)


def _piece_starts(packs: Sequence[Pack], width: int, lens: Sequence[int]) -> np.ndarray:
    """Where every piece starts in the flattened ``[B, width]`` rows."""
    starts, first = [], 0
    for row, pack in enumerate(packs):
        count = len(pack.refs)
        starts += itertools.accumulate(lens[first: first + count - 1], initial=row * width)
        first += count
    return np.array(starts, dtype=np.int64)


def _target_mask(packs: Sequence[Pack], width: int, lens: Sequence[int]) -> np.ndarray | None:
    """``[B * width]`` bool, ``True`` where the label is a target, when some piece carries its own
    labels (a masked document); else ``None`` (every label but a piece's last is a target)."""
    if not any(extra is not None and extra.labels is not None for pack in packs for extra in pack.extras or ()):
        return None
    target = np.zeros(len(packs) * width, dtype=bool)
    first = 0
    for row, pack in enumerate(packs):
        start = row * width
        extras = pack.extras or ()
        for index in range(len(pack.refs)):
            n = lens[first + index]
            extra = extras[index] if index < len(extras) else None
            if extra is not None and extra.labels is not None:
                target[start: start + n] = extra.labels != IGNORE_INDEX
            else:  # the plain shift: every label but the piece's last
                target[start: start + n - 1] = True
            start += n
        first += len(pack.refs)
    return target
