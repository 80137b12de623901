"""``PackedCollator``: packed samples (several documents per row) stacked into one batch.

The label contract and the provenance side channel are described in :mod:`lightning_tune_data.collate`.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from lightning_tune_data.collate.base import (
    PACKED_PROVENANCE_KEYS,
    ArangeCache,
    checked_collator_options,
    one_d_array,
    padded_length,
    required_field,
)
from lightning_tune_data.collate.compact import compact_packs
from lightning_tune_data.collate.provenance import packed_provenance, piece_targets, segment_targets
from lightning_tune_data.collate.worker_memory import batch_planes, batch_tensor
from lightning_tune_data.keys import (
    ATTENTION_MASK,
    DOCUMENT_IDS,
    DROPPED_BEFORE,
    EPOCH,
    IGNORE_INDEX,
    INPUT_IDS,
    LABELS,
    NEW_DOCUMENT,
    PAD_DOCUMENT_ID,
    POSITION_IDS,
    PROVENANCE,
    ROW,
    SEQ_LENS,
    SOURCE,
    TARGET_TOKENS,
    TOKENS,
    TRUNCATED_TOKENS,
)
from lightning_tune_data.packing.pack import Pack, PackedSample
from lightning_tune_data.packing.pieces import DROPPED_AT, EPOCH_AT, LENGTH_AT, NEW_DOCUMENT_AT, SOURCE_AT, TRUNCATED_AT
from lightning_tune_data.packing.rows import write_rows


_PACK, _REFS, _LENGTH = operator.attrgetter("pack"), operator.attrgetter("refs"), operator.attrgetter("length")


def _outputs(planes: int, batch_size: int, width: int, max_documents: int,
             ) -> tuple[np.ndarray, tuple[torch.Tensor, ...], np.ndarray, torch.Tensor]:
    """The ``[planes, B, width]`` block of a packed batch and its zeroed ``[B, max_documents]``
    ``seq_lens``, each as a NumPy array and as tensors (the block's planes one by one).

    In a dataloader worker the tensors are views of one shared-memory storage, so a batch leaves
    the worker as one segment (a second, small tensor cost about a quarter of the batches per
    second a worker delivers); in the main process they wrap two plain NumPy arrays (the fewest
    tensor operations).
    """
    if get_worker_info() is None:
        block, tensors = batch_planes((planes, batch_size, width))
        seq_lens = np.zeros((batch_size, max_documents), dtype=np.int64)
        return block, tensors, seq_lens, torch.from_numpy(seq_lens)
    size = planes * batch_size * width
    storage = batch_tensor((size + batch_size * max_documents,), torch.int64)
    values = storage.numpy()
    block, seq_lens = values[:size].reshape(planes, batch_size, width), values[size:].reshape(batch_size, max_documents)
    seq_lens.fill(0)
    return block, storage[:size].view(planes, batch_size, width).unbind(0), seq_lens, storage[size:].view(
        batch_size, max_documents)


class PackedCollator:
    """Stack *packed samples* (several documents per row) into one batch.

    A packed sample (from ``IterablePackedDataset``) has ``input_ids``, ``labels`` (already
    shifted, ``-100`` at each document end), ``position_ids`` (restarting at 0 per document)
    and ``document_ids`` (``0..k-1`` within the pack): 1-D int arrays of one length ``n``; plus
    ``seq_lens`` (the documents' lengths, summing to ``n``) and ``provenance`` (a list of dicts
    with ``source``, ``epoch``, ``tokens`` and ``new_document``, and optionally
    ``truncated_tokens`` and ``dropped_before``, one per document; a document continued from the
    previous pack has ``new_document=False``).

    Output: ``input_ids``, ``labels``, ``position_ids``, ``document_ids`` as ``[B, L]`` long
    tensors padded with ``pad_id``, ``-100``, ``0`` and ``-1``; ``attention_mask`` ``[B, L]``
    (1 real, 0 pad; use ``document_ids``/``seq_lens`` to stop attention crossing documents);
    ``seq_lens`` ``[B, D]`` long, zero-padded to the most documents in a row; and
    ``provenance`` as in :class:`PaddedCollator`, flattened over rows with ``row`` added.

    Packs are not truncated: cutting a pack would orphan label and provenance bookkeeping,
    and a pack longer than ``max_seq_len`` means the packer and the collator were configured
    with different lengths, which is reported as an error.

    ``compact=True``: the packer's own packs make a compact batch (``collate.compact``) instead.

    Args:
        pad_id: token id written on padding positions (the tokenizer's ``pad_id``).
        max_seq_len: the packer's length; a longer pack raises. ``None``: not checked.
        pad_to_multiple_of: round the padded length up to a multiple of this.
        compact: send compact batches (expanded after transfer) instead of full ones.
    """

    _ARRAY_KEYS = (INPUT_IDS, LABELS, POSITION_IDS, DOCUMENT_IDS)

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
        self._arange = ArangeCache()

    def _validated(
        self, index: int, sample: Mapping[str, Any]
    ) -> tuple[list[np.ndarray], list[int], list[Mapping[str, Any]]]:
        """The arrays, seq_lens and provenance of one packed sample, after consistency checks."""
        owner = type(self).__name__
        what = "packed samples come from IterablePackedDataset (unpacked: use PaddedCollator)."
        arrays = [
            one_d_array(owner, index, key, required_field(owner, index, sample, key, what))
            for key in self._ARRAY_KEYS
        ]
        n = arrays[0].shape[0]
        for key, array in zip(self._ARRAY_KEYS[1:], arrays[1:]):
            if array.shape[0] != n:
                raise ValueError(
                    f"{owner}: sample {index} field {key!r} has length {array.shape[0]} but "
                    f"input_ids has length {n}; every per-token field must have the same length."
                )
        if self.max_seq_len is not None and n > self.max_seq_len:
            raise ValueError(
                f"{owner}: sample {index} is a pack of {n} tokens, longer than max_seq_len="
                f"{self.max_seq_len}. Give the packer and the collator the same max_seq_len."
            )
        seq_lens = [int(length) for length in required_field(owner, index, sample, SEQ_LENS, what)]
        if sum(seq_lens) != n:
            raise ValueError(
                f"{owner}: sample {index} seq_lens={seq_lens} sum to {sum(seq_lens)}, but the "
                f"pack has {n} tokens; seq_lens must list every document's length in the pack."
            )
        provenance = list(required_field(owner, index, sample, PROVENANCE, what))
        if len(provenance) != len(seq_lens):
            raise ValueError(
                f"{owner}: sample {index} has {len(seq_lens)} seq_lens but {len(provenance)} "
                "provenance entries; there must be one provenance entry per document."
            )
        for document in provenance:
            missing = [key for key in PACKED_PROVENANCE_KEYS if key not in document]
            if missing:
                raise ValueError(
                    f"{owner}: sample {index} has a provenance entry without {missing} (got "
                    f"{sorted(document)}); each entry needs {list(PACKED_PROVENANCE_KEYS)}."
                )
        return arrays, seq_lens, provenance

    def __call__(self, samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Collate packed ``samples`` (see the class docstring) into a batch.

        Args:
            samples: the packs of this batch, one per row.

        Returns:
            ``input_ids``, ``labels``, ``position_ids``, ``document_ids``, ``attention_mask``
            (``[B, L]`` long), ``seq_lens`` (``[B, D]`` long) and ``provenance`` (dict of lists).

        Raises:
            ValueError: the batch is empty, or a sample misses a field or is inconsistent.
        """
        owner = type(self).__name__
        if len(samples) == 0:
            raise ValueError(f"{owner}: cannot collate an empty list of samples.")
        if set(map(type, samples)) == {PackedSample}:
            packs = list(map(_PACK, samples))
            if None not in packs:  # the packer's own packs (not rebuilt from their items)
                return self._collate_packs(packs)
        validated = [self._validated(index, sample) for index, sample in enumerate(samples)]
        batch_size = len(validated)
        lengths = np.fromiter(
            (arrays[0].shape[0] for arrays, _, _ in validated), dtype=np.int64, count=batch_size
        )
        width = padded_length(int(lengths.max()), self.pad_to_multiple_of)
        max_documents = max(len(v[1]) for v in validated)

        fills = (self.pad_id, IGNORE_INDEX, 0, PAD_DOCUMENT_ID)
        # One tensor holds every [B, L] output (one shared-memory segment per batch from a worker).
        views, planes, seq_lens, seq_lens_tensor = _outputs(len(fills) + 1, batch_size, width, max_documents)
        outputs = list(views[: len(fills)])
        attention_mask = views[len(fills)]
        for row, (arrays, row_seq_lens, _) in enumerate(validated):
            # Row by row: each output row is one copy of the pack plus one fill of its padding.
            n = arrays[0].shape[0]
            for output, array, fill in zip(outputs, arrays, fills):
                output[row, :n] = array
                if n < width:
                    output[row, n:] = fill
            attention_mask[row, :n] = 1
            if n < width:
                attention_mask[row, n:] = 0
            seq_lens[row, : len(row_seq_lens)] = row_seq_lens

        batch: dict[str, Any] = dict(zip(self._ARRAY_KEYS, planes))
        batch[ATTENTION_MASK] = planes[len(fills)]
        batch[SEQ_LENS] = seq_lens_tensor
        targets = [count for arrays, row_seq_lens, _ in validated
                   for count in segment_targets(arrays[1], np.cumsum([0, *row_seq_lens[:-1]])).tolist()]
        batch[PROVENANCE] = packed_provenance([v[2] for v in validated], targets)
        return batch

    def _collate_packs(self, packs: list[Pack]) -> dict[str, Any]:
        """The batch of the packer's own packs, built in bulk from their pieces.

        All rows' tokens and padding are written in place by ``write_rows`` (one join of the
        pieces' byte ranges when they are positions in flat token arrays); labels are the
        rows shifted by one with ``-100`` at every piece's end; ``position_ids``/``document_ids``
        come from the piece lengths by one repeat over the whole block, where each row's padding
        is one more segment; provenance is one transpose of the pieces' references. Same batch
        as the per-sample path, bit for bit.
        """
        owner = type(self).__name__
        batch_size = len(packs)
        pack_lengths = list(map(_LENGTH, packs))
        longest = max(pack_lengths)
        if self.max_seq_len is not None and longest > self.max_seq_len:
            raise ValueError(
                f"{owner}: a pack of {longest} tokens is longer than max_seq_len={self.max_seq_len}. Give "
                "the packer and the collator the same max_seq_len."
            )
        width = padded_length(longest, self.pad_to_multiple_of)
        refs = list(map(_REFS, packs))
        counts = list(map(len, refs))
        most = max(counts)
        columns = tuple(zip(*itertools.chain.from_iterable(refs)))
        lens = columns[LENGTH_AT]
        if most == min(counts):
            seq_lens_values = lens
        else:
            seq_lens_values, zeros, first = [], (0,) * most, 0
            for count in counts:
                seq_lens_values += lens[first : first + count]
                seq_lens_values += zeros[count:]
                first += count
        provenance = {
            SOURCE: list(columns[SOURCE_AT]),
            EPOCH: list(columns[EPOCH_AT]),
            TOKENS: list(lens),
            ROW: list(itertools.chain.from_iterable(itertools.starmap(itertools.repeat, enumerate(counts)))),
            NEW_DOCUMENT: list(columns[NEW_DOCUMENT_AT]),
            DROPPED_BEFORE: list(columns[DROPPED_AT]),
            TRUNCATED_TOKENS: list(columns[TRUNCATED_AT]),
        }
        if self.compact:
            batch = compact_packs(packs, width, self.pad_id, lens, columns[SOURCE_AT], seq_lens_values, most, provenance)
            if batch is not None:
                return batch
        full = longest == width and min(pack_lengths) == width
        # Segments of the flattened [B, width] block: every piece, and each row's padding (a few
        # dozen values: Python lists are cheaper than NumPy calls at this size). Rows without
        # padding (every row of a ``concat`` batch) are their pieces back to back.
        if full:
            segment_lens = lens
            segment_documents = list(itertools.chain.from_iterable(map(range, counts)))
        else:
            segment_lens, segment_documents = [], []
            first = 0
            for count, n in zip(counts, pack_lengths):
                segment_lens += lens[first : first + count]
                segment_lens.append(width - n)
                first += count
                segment_documents += range(count)
                segment_documents.append(PAD_DOCUMENT_ID)
        segment_lens_array = np.array(segment_lens, dtype=np.int64)
        segment_ends = segment_lens_array.cumsum()
        segment_documents_array = np.array(segment_documents, dtype=np.int64)

        fills = (self.pad_id, IGNORE_INDEX, 0, PAD_DOCUMENT_ID)
        views, planes, seq_lens, seq_lens_tensor = _outputs(len(fills) + 1, batch_size, width, most)
        flat_tokens, flat_labels = views[0].reshape(-1), views[1].reshape(-1)
        joined = write_rows(packs, width, self.pad_id, flat_tokens, lens, columns[SOURCE_AT])
        # Shifted over the whole block (from the joined rows in their narrower dtype when there
        # are some): a row's last label is a piece's end or padding, set below.
        np.copyto(flat_labels[:-1], (flat_tokens if joined is None else joined)[1:], casting="same_kind")
        # Every segment's last label: a piece's end, or inside (or just before) a row's padding.
        flat_labels[segment_ends - 1] = IGNORE_INDEX
        for row, pack in enumerate(packs):
            if pack.extras is not None:  # a masked document carries its own labels
                start = row * width
                for ref, extra in zip(pack.refs, pack.extras):
                    if extra is not None and extra.labels is not None:
                        flat_labels[start : start + ref[LENGTH_AT]] = extra.labels
                    start += ref[LENGTH_AT]
        np.subtract(self._arange(batch_size * width), (segment_ends - segment_lens_array).repeat(segment_lens_array),
                    out=views[2].reshape(-1))
        views[3].reshape(-1)[:] = segment_documents_array.repeat(segment_lens_array)
        views[len(fills)].fill(1)
        if not full:
            padding = np.array((*fills[1:], 0), dtype=np.int64)[:, None]
            for row, n in enumerate(pack_lengths):
                if n < width:
                    views[1:, row, n:] = padding
        seq_lens.reshape(-1)[:] = seq_lens_values
        batch: dict[str, Any] = dict(zip(self._ARRAY_KEYS, planes))
        batch[ATTENTION_MASK] = planes[len(fills)]
        batch[SEQ_LENS] = seq_lens_tensor
        provenance[TARGET_TOKENS] = piece_targets(packs, lens, joined, flat_labels, segment_ends - segment_lens_array,
                                                   segment_documents_array)
        batch[PROVENANCE] = provenance
        return batch

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(pad_id={self.pad_id}, max_seq_len={self.max_seq_len}, "
            f"pad_to_multiple_of={self.pad_to_multiple_of}, compact={self.compact})"
        )
