"""``expand_batch``: a compact train batch turned into the full batch the model trains on.

A compact batch (:mod:`lightning_tune_data.collate.compact`) carries token ids, the documents'
lengths and, when a document masks targets, a target mask. Everything else follows from them,
and is derived here with a handful of whole-batch tensor operations on the batch's own device
(after the transfer, on a GPU run) without a host synchronisation:

* ``input_ids``: the ids as int64;
* ``attention_mask``: 1 on real tokens, 0 on padding;
* packed: ``document_ids`` (``0..k-1`` per row, ``-1`` on padding) and ``position_ids``
  (restarting at 0 for every document, 0 on padding), from ``seq_lens``;
  padded: ``position_ids`` (``0..n-1``, 0 on padding), from the row lengths;
* ``labels``: the next id where the label is a target, ``-100`` elsewhere. Without a target mask a
  label is a target when the next position is a real token of the same document.

On the host (a CPU run) the same is computed with NumPy, each plane written once (a packed batch's
padding only where a row has some): a few tens of microseconds, without torch's intra-op thread
pool, which costs milliseconds per batch when the process shares its cores with dataloader workers.

The result equals, bit for bit, the full batch the collator writes with ``compact=False`` (the
tests compare both for every packing strategy, masked and unmasked documents, and resumed runs).
A batch that is not compact is returned unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from lightning_tune_data.collate.base import ArangeCache
from lightning_tune_data.keys import (
    ATTENTION_MASK,
    COMPACT_LAYOUT,
    DOCUMENT_IDS,
    IGNORE_INDEX,
    INPUT_IDS,
    LABELS,
    PAD_DOCUMENT_ID,
    POSITION_IDS,
    PROVENANCE,
    ROW_LENGTHS,
    SEQ_LENS,
    TARGET_MASK,
)

__all__ = ["expand_batch", "is_compact"]


def is_compact(batch: Any) -> bool:
    """Whether ``batch`` is a compact batch (a mapping with a ``compact_layout``).

    Args:
        batch: anything a loader hands out.
    """
    return isinstance(batch, Mapping) and COMPACT_LAYOUT in batch


def expand_batch(batch: Any) -> Any:
    """The full batch of a compact ``batch`` (see the module docstring); any other batch as is.

    Args:
        batch: a compact batch (on any device), or any other batch.

    Returns:
        For a packed batch ``input_ids``, ``labels``, ``position_ids``, ``document_ids``,
        ``attention_mask`` (``[B, L]`` int64), ``seq_lens`` and ``provenance``; for a padded one
        ``input_ids``, ``labels``, ``attention_mask``, ``position_ids`` and ``provenance``: the
        keys, order, dtypes and values of the collator's full batch.

    Raises:
        ValueError: the compact layout is unknown (a batch written by another version).
    """
    if not is_compact(batch):
        return batch
    layout = batch[COMPACT_LAYOUT]
    if layout not in _EXPANSIONS:
        raise ValueError(f"expand_batch: unknown compact layout {layout!r}; expected 'packed' or 'padded'.")
    on_device, on_host = _EXPANSIONS[layout]
    return on_host(batch) if batch[INPUT_IDS].device.type == "cpu" else on_device(batch)


def _labels(input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``[B, L]`` labels: ``input_ids[:, i + 1]`` where ``targets[:, i]``, else ``-100`` (the last
    column is never a target)."""
    labels = torch.full_like(input_ids, IGNORE_INDEX)
    labels[:, :-1] = torch.where(targets[:, :-1], input_ids[:, 1:], IGNORE_INDEX)
    return labels


def _expand_packed(batch: Mapping[str, Any]) -> dict[str, Any]:
    ids, seq_lens = batch[INPUT_IDS], batch[SEQ_LENS]
    rows, width = ids.shape
    device = ids.device
    input_ids = ids.long()
    # Each row is its documents then its padding: one more segment per row, of document id -1.
    padding = width - seq_lens.sum(dim=1, keepdim=True)
    counts = torch.cat((seq_lens, padding), dim=1).reshape(-1)
    numbers = torch.arange(seq_lens.shape[1] + 1, device=device)
    numbers[-1] = PAD_DOCUMENT_ID
    size = rows * width
    document_ids = numbers.repeat(rows).repeat_interleave(counts, output_size=size).view(rows, width)
    starts = counts.cumsum(0) - counts
    position_ids = torch.arange(size, device=device) - starts.repeat_interleave(counts, output_size=size)
    real = document_ids != PAD_DOCUMENT_ID
    position_ids = position_ids.view(rows, width).mul_(real)
    targets = batch.get(TARGET_MASK)
    if targets is None:
        targets = torch.zeros_like(real)
        targets[:, :-1] = (document_ids[:, 1:] == document_ids[:, :-1]) & real[:, 1:]
    return {
        INPUT_IDS: input_ids,
        LABELS: _labels(input_ids, targets),
        POSITION_IDS: position_ids,
        DOCUMENT_IDS: document_ids,
        ATTENTION_MASK: real.long(),
        SEQ_LENS: seq_lens,
        PROVENANCE: batch[PROVENANCE],
    }


def _expand_padded(batch: Mapping[str, Any]) -> dict[str, Any]:
    ids, lengths = batch[INPUT_IDS], batch[ROW_LENGTHS]
    width = ids.shape[1]
    columns = torch.arange(width, device=ids.device)
    real = columns < lengths[:, None]
    input_ids = ids.long()
    targets = batch.get(TARGET_MASK)
    if targets is None:
        targets = torch.zeros_like(real)
        targets[:, :-1] = real[:, 1:]
    attention_mask = real.long()
    return {
        INPUT_IDS: input_ids,
        LABELS: _labels(input_ids, targets),
        ATTENTION_MASK: attention_mask,
        POSITION_IDS: columns * attention_mask,
        PROVENANCE: batch[PROVENANCE],
    }


def _expand_packed_on_host(batch: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`_expand_packed` with NumPy, in as few passes over the ``[B, L]`` planes as the format
    allows (each plane is written once, padding only where a row has some).

    Every row is its documents then its padding, one more segment (of document id ``-1``). The
    label at a segment's last position is ``-100`` (a document's last token, or padding), every
    other real token's label is the next id; ``position_ids`` are the positions minus their
    segment's start, with each row's padding set to 0 afterwards (a slice per padded row).
    """
    ids, seq_lens = batch[INPUT_IDS].numpy(), batch[SEQ_LENS].numpy()
    rows, width = ids.shape
    size = rows * width
    documents = seq_lens.shape[1]
    lengths = seq_lens.sum(axis=1)
    counts = np.empty((rows, documents + 1), dtype=np.int64)
    counts[:, :documents] = seq_lens
    np.subtract(width, lengths, out=counts[:, documents])
    counts = counts.reshape(-1)
    ends = counts.cumsum()
    input_ids = ids.astype(np.int64)
    document_ids = np.repeat(_segment_numbers(documents, rows), counts)
    position_ids = np.repeat(ends - counts, counts)
    np.subtract(_POSITIONS(size), position_ids, out=position_ids)
    attention_mask = np.ones(size, dtype=np.int64)
    labels = np.empty(size, dtype=np.int64)
    targets = batch.get(TARGET_MASK)
    if targets is None:
        labels[:-1] = ids.reshape(-1)[1:]
        labels[ends - 1] = IGNORE_INDEX  # every segment's last label (a zero-length one's falls on an end too)
    else:
        labels.fill(IGNORE_INDEX)
        np.copyto(labels.reshape(rows, width)[:, :-1], input_ids[:, 1:], where=targets.numpy()[:, :-1])
    if size:
        labels[-1] = IGNORE_INDEX
    position_ids, document_ids, attention_mask, labels = (plane.reshape(rows, width) for plane in
                                                         (position_ids, document_ids, attention_mask, labels))
    for row in np.flatnonzero(lengths < width).tolist():  # rows with padding (none in a ``concat`` batch)
        n = int(lengths[row])
        position_ids[row, n:] = 0
        attention_mask[row, n:] = 0
        labels[row, n:] = IGNORE_INDEX
    return {
        INPUT_IDS: torch.from_numpy(input_ids),
        LABELS: torch.from_numpy(labels),
        POSITION_IDS: torch.from_numpy(position_ids),
        DOCUMENT_IDS: torch.from_numpy(document_ids),
        ATTENTION_MASK: torch.from_numpy(attention_mask),
        SEQ_LENS: batch[SEQ_LENS],
        PROVENANCE: batch[PROVENANCE],
    }


#: ``0..n-1`` as views of one cached array (only read here).
_POSITIONS = ArangeCache()


@functools.lru_cache(maxsize=64)
def _segment_numbers(documents: int, rows: int) -> np.ndarray:
    """Each row's segment numbers ``0..documents-1, -1`` (its padding), ``rows`` times (cached, read-only)."""
    row = np.arange(documents + 1, dtype=np.int64)
    row[-1] = PAD_DOCUMENT_ID
    numbers = np.tile(row, rows)
    numbers.flags.writeable = False
    return numbers


def _expand_padded_on_host(batch: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`_expand_padded` with NumPy, into one ``[4, B, L]`` block."""
    ids, lengths = batch[INPUT_IDS].numpy(), batch[ROW_LENGTHS].numpy()
    rows, width = ids.shape
    block = np.empty((4, rows, width), dtype=np.int64)
    input_ids, labels, attention_mask, position_ids = block
    np.copyto(input_ids, ids)
    columns = np.arange(width, dtype=np.int64)
    real = columns < lengths[:, None]
    np.copyto(attention_mask, real)
    np.multiply(columns, attention_mask, out=position_ids)
    targets = batch.get(TARGET_MASK)
    if targets is None:
        targets = np.zeros_like(real)
        targets[:, :-1] = real[:, 1:]
    else:
        targets = targets.numpy()
    _host_labels(input_ids, targets, labels)
    planes = [torch.from_numpy(plane) for plane in block]
    return {
        INPUT_IDS: planes[0],
        LABELS: planes[1],
        ATTENTION_MASK: planes[2],
        POSITION_IDS: planes[3],
        PROVENANCE: batch[PROVENANCE],
    }


def _host_labels(input_ids: np.ndarray, targets: np.ndarray, out: np.ndarray) -> None:
    """:func:`_labels` with NumPy, written into ``out``."""
    out.fill(IGNORE_INDEX)
    np.copyto(out[:, :-1], input_ids[:, 1:], where=targets[:, :-1])


#: Per compact layout: its expansion with torch (any device) and with NumPy (on the host).
_EXPANSIONS = {"packed": (_expand_packed, _expand_packed_on_host), "padded": (_expand_padded, _expand_padded_on_host)}
