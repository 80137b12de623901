"""``PaddedCollator``: document samples padded into one batch, one document per row.

The label contract and the provenance side channel are described in :mod:`lightning_tune_data.collate`.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from lightning_tune_data.collate.base import (
    CACHED_WIDTH,
    ArangeCache,
    checked_collator_options,
    count_field,
    one_d_array,
    padded_length,
    required_field,
)
from lightning_tune_data.collate.compact import compact_ids_dtype, compact_padded_batch
from lightning_tune_data.collate.worker_memory import batch_planes
from lightning_tune_data.keys import (
    ATTENTION_MASK,
    DROPPED_BEFORE,
    EPOCH,
    IGNORE_INDEX,
    INPUT_IDS,
    LABELS,
    LOSS_MASK,
    NEW_DOCUMENT,
    POSITION_IDS,
    PROVENANCE,
    ROW,
    SOURCE,
    TARGET_TOKENS,
    TOKENS,
    TRUNCATED_TOKENS,
)

#: The fields every document sample has, the optional ones the padded collator reads, a dtype getter.
_DOCUMENT_FIELDS = operator.itemgetter(INPUT_IDS, SOURCE, EPOCH)
_OPTIONAL_FIELDS = frozenset((LOSS_MASK, TRUNCATED_TOKENS, DROPPED_BEFORE))
_DTYPE = operator.attrgetter("dtype")

#: A batch's documents: lengths (after truncation), the token ids concatenated, loss masks
#: (``None``: no sample has one), sources, epochs, truncated_tokens and dropped_before.
_Documents = tuple[
    list[int], np.ndarray, "list[np.ndarray | None] | None", list[str], list[int], list[int], list[int]
]


class PaddedCollator:
    """Pad a list of *document samples* into one batch, one document per row.

    Each row holds one document: ``input_ids`` padded with ``pad_id``, ``labels`` shifted per
    document (``-100`` at the document's last token, on masked prompt tokens and on padding),
    ``attention_mask`` (1 real, 0 pad) and ``position_ids`` (``0..n-1``, 0 on padding). The row
    length ``L`` is the longest sample, rounded up to ``pad_to_multiple_of``.

    Documents longer than ``max_seq_len`` are truncated to their first ``max_seq_len`` tokens
    and the last kept token gets label ``-100``. This is only a safety net: the stream applies
    the configured overflow policy earlier, where it can be counted and reported.

    Input samples are dicts with ``input_ids`` (1-D int array), optional ``loss_mask`` (1-D bool
    array, ``True`` = training target; a non-bool mask is read as true/false), ``source`` (str)
    and ``epoch`` (int); other keys are ignored. The output also carries ``provenance``: plain
    lists ``source``, ``epoch``, ``tokens`` (real tokens of the document in this batch), ``row``,
    ``new_document`` (always ``True`` here), ``truncated_tokens`` (the sample's own
    ``truncated_tokens`` plus any tokens cut here), ``dropped_before`` (the sample's,
    default 0) and ``target_tokens`` (labels of the row that are targets; ``0``: the document
    adds nothing to the loss), one entry per row.

    With ``compact=True`` it writes a *compact* batch instead (token ids, row lengths, a target
    mask only when a document has a loss mask, provenance; see
    :mod:`lightning_tune_data.collate.compact`), which
    :func:`~lightning_tune_data.collate.expand.expand_batch` turns into exactly the batch above.

    Args:
        pad_id: token id written on padding positions (the tokenizer's ``pad_id``).
        max_seq_len: longest document kept; longer ones are truncated. ``None``: no limit.
        pad_to_multiple_of: round the padded length up to a multiple of this (e.g. 8 for tensor
            cores, or a context-parallel divisor). The rounding can exceed ``max_seq_len``; the
            extra positions are padding.
        compact: send compact batches (expanded after transfer) instead of full ones.
    """

    def __init__(
        self,
        pad_id: int,
        max_seq_len: int | None = None,
        pad_to_multiple_of: int | None = None,
        compact: bool = False,
    ) -> None:
        self.pad_id, self.max_seq_len, self.pad_to_multiple_of = checked_collator_options(
            type(self).__name__, pad_id, max_seq_len, pad_to_multiple_of
        )
        self.compact = bool(compact)
        self._columns = ArangeCache()
        self._windows: np.ndarray | None = None

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Collate ``samples`` (document samples, see the class docstring) into a batch.

        Args:
            samples: the documents of this batch, one per row.

        Returns:
            ``input_ids``, ``labels``, ``attention_mask``, ``position_ids``: ``[B, L]`` long
            tensors, and ``provenance``: a dict of lists (see the class docstring).

        Raises:
            ValueError: the batch is empty, or a sample misses a field or has a malformed one.
        """
        if len(samples) == 0:
            raise ValueError(f"{type(self).__name__}: cannot collate an empty list of samples.")
        documents = self._common_documents(samples)
        if documents is None:
            documents = self._checked_documents(samples)
        lengths, tokens, masks, sources, epochs, truncated, dropped = documents
        batch_size = len(lengths)
        provenance = {
            SOURCE: sources,
            EPOCH: epochs,
            TOKENS: lengths,
            ROW: list(range(batch_size)),
            NEW_DOCUMENT: [True] * batch_size,
            TRUNCATED_TOKENS: truncated,
            DROPPED_BEFORE: dropped,
        }
        if self.compact:
            dtype = compact_ids_dtype(tokens, self.pad_id)
            if dtype is not None:
                width = padded_length(max(lengths), self.pad_to_multiple_of)
                real = self._real_tokens(lengths, width)
                targets = None if masks is None else self._targets(real, lengths, masks)
                provenance[TARGET_TOKENS] = np.count_nonzero((real if targets is None else targets)[:, 1:],
                                                             axis=1).tolist()
                return compact_padded_batch(tokens, dtype, lengths, width, self.pad_id, real, targets, provenance)
        (input_ids, labels, attention_mask, position_ids), provenance[TARGET_TOKENS] = self._block(lengths, tokens,
                                                                                                   masks)
        return {
            INPUT_IDS: input_ids,
            LABELS: labels,
            ATTENTION_MASK: attention_mask,
            POSITION_IDS: position_ids,
            PROVENANCE: provenance,
        }

    def _common_documents(self, samples: Sequence[Mapping[str, Any]]) -> _Documents | None:
        """The documents of the common batch (no loss mask, 1-D integer token ids), checked in bulk.

        ``None`` when anything is unusual: :meth:`_checked_documents` then checks sample by sample
        and raises the error that names the sample and the field.
        """
        try:
            ids_list, sources, epochs = zip(*map(_DOCUMENT_FIELDS, samples))
            sources, epochs = list(map(str, sources)), list(map(int, epochs))
            optional = _OPTIONAL_FIELDS.intersection(set().union(*samples))
            if LOSS_MASK in optional and any(sample.get(LOSS_MASK) is not None for sample in samples):
                return None
            lengths = list(map(len, ids_list))
            cap = self.max_seq_len
            cut = None
            if cap is not None and max(lengths) > cap:
                cut = [max(n - cap, 0) for n in lengths]
                ids_list = [ids[:cap] for ids in ids_list]
                lengths = [min(n, cap) for n in lengths]
            dtypes = set(map(_DTYPE, ids_list))
            if len(dtypes) == 1:  # one join of the documents' bytes: a fraction of a concatenate of views
                tokens = np.frombuffer(b"".join(ids_list), dtype=dtypes.pop())
            else:
                tokens = np.concatenate(ids_list)
        except (AttributeError, BufferError, KeyError, TypeError, ValueError):
            return None
        if tokens.dtype.kind not in "iu" or any(dtype.kind not in "iu" for dtype in dtypes) or tokens.ndim != 1 \
                or tokens.shape[0] != sum(lengths):
            return None  # not all 1-D integer arrays: the per-sample checks say which sample and why
        owner = type(self).__name__
        if TRUNCATED_TOKENS in optional:
            truncated = [count_field(owner, i, sample, TRUNCATED_TOKENS) for i, sample in enumerate(samples)]
            if cut is not None:
                truncated = [count + extra for count, extra in zip(truncated, cut)]
        else:
            truncated = cut if cut is not None else [0] * len(samples)
        if DROPPED_BEFORE in optional:
            dropped = [count_field(owner, i, sample, DROPPED_BEFORE) for i, sample in enumerate(samples)]
        else:
            dropped = [0] * len(samples)
        return lengths, tokens, None, sources, epochs, truncated, dropped

    def _checked_documents(self, samples: Sequence[Mapping[str, Any]]) -> _Documents:
        """The documents of any batch, checked sample by sample (clear errors for bad input)."""
        owner = type(self).__name__
        ids_list: list[np.ndarray] = []
        masks: list[np.ndarray | None] = []
        sources: list[str] = []
        epochs: list[int] = []
        truncated: list[int] = []
        dropped: list[int] = []
        for index, sample in enumerate(samples):
            ids = one_d_array(
                owner, index, INPUT_IDS,
                required_field(owner, index, sample, INPUT_IDS, "document samples need token ids."),
            )
            mask = sample.get(LOSS_MASK)
            if mask is not None:
                mask = one_d_array(owner, index, LOSS_MASK, mask, integer=False)
                if mask.shape != ids.shape:
                    raise ValueError(
                        f"{owner}: sample {index} has {ids.shape[0]} input_ids but "
                        f"{mask.shape[0]} loss_mask entries; they must describe the same tokens."
                    )
                mask = mask.astype(bool, copy=False)
            cut = count_field(owner, index, sample, TRUNCATED_TOKENS)
            if self.max_seq_len is not None and ids.shape[0] > self.max_seq_len:
                cut += ids.shape[0] - self.max_seq_len
                ids = ids[: self.max_seq_len]
                mask = None if mask is None else mask[: self.max_seq_len]
            ids_list.append(ids)
            masks.append(mask)
            source = required_field(owner, index, sample, SOURCE, "the stream sets the source name.")
            epoch = required_field(owner, index, sample, EPOCH, "the stream sets the source's pass.")
            sources.append(str(source))
            epochs.append(int(epoch))
            truncated.append(cut)
            dropped.append(count_field(owner, index, sample, DROPPED_BEFORE))
        # Each document's ids cast to int64 on their own (exactly what a row-by-row copy writes).
        total = sum(ids.shape[0] for ids in ids_list)
        tokens = np.concatenate(ids_list, out=np.empty(total, dtype=np.int64), casting="unsafe")
        lengths = [ids.shape[0] for ids in ids_list]
        any_mask = any(mask is not None for mask in masks)
        return lengths, tokens, masks if any_mask else None, sources, epochs, truncated, dropped

    def _block(
        self, lengths: list[int], tokens: np.ndarray, masks: Sequence[np.ndarray | None] | None
    ) -> tuple[tuple[torch.Tensor, ...], list[int]]:
        """The ``[4, B, L]`` block's planes (input_ids, labels, attention_mask and position_ids) and
        the number of target labels of each row.

        ``tokens`` are the documents' ids concatenated; the row-major "real token" mask scatters
        them into their rows in one pass. Labels are the padded ids shifted by one, copied only
        where the next position holds a target (a real token, not masked): every document end,
        padding position and masked target keeps ``-100``.
        """
        batch_size = len(lengths)
        width = padded_length(max(lengths), self.pad_to_multiple_of)
        # One block holds all four outputs: a batch then crosses from a dataloader worker in one
        # shared-memory segment instead of four, built there directly (see worker_memory).
        block, planes = batch_planes((4, batch_size, width))
        input_ids, labels, attention_mask, position_ids = block
        real = self._real_tokens(lengths, width)  # [B, L]: True on real tokens
        np.copyto(attention_mask, real)
        np.multiply(self._columns(width), attention_mask, out=position_ids)
        input_ids.fill(self.pad_id)
        input_ids[real] = tokens
        targets = real if masks is None else self._targets(real, lengths, masks)
        labels.fill(IGNORE_INDEX)
        np.copyto(labels[:, :-1], input_ids[:, 1:], where=targets[:, 1:])
        return planes, np.count_nonzero(targets[:, 1:], axis=1).tolist()

    @staticmethod
    def _targets(real: np.ndarray, lengths: list[int], masks: Sequence[np.ndarray | None]) -> np.ndarray:
        """``[B, L]`` bool: ``True`` on the real tokens that are targets (their loss mask, or all of a
        document without one)."""
        targets = np.zeros(real.shape, dtype=bool)
        targets[real] = np.concatenate([np.ones(n, dtype=bool) if mask is None else mask for n, mask in zip(lengths, masks)])
        return targets

    def _real_tokens(self, lengths: list[int], width: int) -> np.ndarray:
        """``[B, width]`` bool: ``True`` at the columns below each row's length.

        Each row is copied from a cached read-only window over ``size`` ``True`` then ``size``
        ``False`` values (row ``size - n`` starts with ``n`` ``True``), which is cheaper than a
        broadcast comparison over the whole batch.
        """
        window = self._windows
        if window is None or window.shape[1] < width:
            size = max(width, CACHED_WIDTH)
            base = np.zeros(2 * size, dtype=bool)
            base[:size] = True
            window = self._windows = np.lib.stride_tricks.as_strided(
                base, shape=(size + 1, size), strides=(1, 1), writeable=False
            )
        return window[np.subtract(window.shape[1], lengths), :width]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_windows": None}  # caches are rebuilt on first use

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(pad_id={self.pad_id}, max_seq_len={self.max_seq_len}, "
            f"pad_to_multiple_of={self.pad_to_multiple_of}, compact={self.compact})"
        )
