"""``PackedCollator``: packed samples (several documents per row) stacked into one batch (see ``collate.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from lightning_tune_data.collate_base import (
    _PACKED_PROVENANCE_KEYS,
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
    TOKENS,
    TRUNCATED_TOKENS,
    ArangeCache,
    checked_collator_options,
    _one_d,
    _padded_length,
    _required,
)
from lightning_tune_data.streams.pack_pieces import (
    DROPPED_AT,
    EPOCH_AT,
    LENGTH_AT,
    NEW_DOCUMENT_AT,
    SOURCE_AT,
    TRUNCATED_AT,
    Pack,
    PackedSample,
    token_arrays,
)
from lightning_tune_data.worker_memory import batch_tensor


def _outputs(planes: int, batch_size: int, width: int, max_documents: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``[planes, B, width]`` block of a packed batch and its zeroed ``[B, max_documents]``
    ``seq_lens``, views of one allocation: a batch leaving a worker is one shared-memory segment
    (a second, small tensor cost about a quarter of the batches per second a worker delivers)."""
    size = planes * batch_size * width
    storage = batch_tensor((size + batch_size * max_documents,), torch.int64)
    seq_lens = storage[size:].view(batch_size, max_documents)
    seq_lens.numpy().fill(0)
    return storage[:size].view(planes, batch_size, width), seq_lens


def packed_provenance(rows: Sequence[Sequence[Mapping[str, Any]]]) -> dict[str, list[Any]]:
    """The per-document provenance of packed rows as one dict of lists, flattened over rows.

    Every key found in any document's provenance dict is carried, and always ``truncated_tokens``
    and ``dropped_before`` (the length-policy counts the metrics read); a document without a key
    gets ``0``.
    ``row`` is added: the batch row each document sits in.

    Args:
        rows: per batch row, the provenance dicts of its documents, in order.
    """
    documents = [document for row in rows for document in row]
    provenance: dict[str, list[Any]] = {
        SOURCE: [str(d[SOURCE]) for d in documents],
        EPOCH: [int(d[EPOCH]) for d in documents],
        TOKENS: [int(d[TOKENS]) for d in documents],
        ROW: [row for row, documents_in_row in enumerate(rows) for _ in documents_in_row],
        NEW_DOCUMENT: [bool(d[NEW_DOCUMENT]) for d in documents],
    }
    for key in sorted(set().union(*documents, (TRUNCATED_TOKENS, DROPPED_BEFORE)).difference(provenance)):
        provenance[key] = [document.get(key, 0) for document in documents]
    return provenance


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

    Args:
        pad_id: token id written on padding positions (the tokenizer's ``pad_id``).
        max_seq_len: the packer's length; a longer pack raises. ``None``: not checked.
        pad_to_multiple_of: round the padded length up to a multiple of this.
    """

    _ARRAY_KEYS = (INPUT_IDS, LABELS, POSITION_IDS, DOCUMENT_IDS)

    def __init__(
        self,
        pad_id: int,
        max_seq_len: int | None = None,
        pad_to_multiple_of: int | None = None,
    ) -> None:
        self.pad_id, self.max_seq_len, self.pad_to_multiple_of = checked_collator_options(
            type(self).__name__, pad_id, max_seq_len, pad_to_multiple_of
        )
        self._arange = ArangeCache()

    def _validated(
        self, index: int, sample: Mapping[str, Any]
    ) -> tuple[list[np.ndarray], list[int], list[Mapping[str, Any]]]:
        """The arrays, seq_lens and provenance of one packed sample, after consistency checks."""
        owner = type(self).__name__
        what = "packed samples come from IterablePackedDataset (unpacked: use PaddedCollator)."
        arrays = [
            _one_d(owner, index, key, _required(owner, index, sample, key, what))
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
        seq_lens = [int(length) for length in _required(owner, index, sample, SEQ_LENS, what)]
        if sum(seq_lens) != n:
            raise ValueError(
                f"{owner}: sample {index} seq_lens={seq_lens} sum to {sum(seq_lens)}, but the "
                f"pack has {n} tokens; seq_lens must list every document's length in the pack."
            )
        provenance = list(_required(owner, index, sample, PROVENANCE, what))
        if len(provenance) != len(seq_lens):
            raise ValueError(
                f"{owner}: sample {index} has {len(seq_lens)} seq_lens but {len(provenance)} "
                "provenance entries; there must be one provenance entry per document."
            )
        for document in provenance:
            missing = [key for key in _PACKED_PROVENANCE_KEYS if key not in document]
            if missing:
                raise ValueError(
                    f"{owner}: sample {index} has a provenance entry without {missing} (got "
                    f"{sorted(document)}); each entry needs {list(_PACKED_PROVENANCE_KEYS)}."
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
        if all(type(sample) is PackedSample and sample.pack is not None for sample in samples):
            return self._collate_packs([sample.pack for sample in samples])
        validated = [self._validated(index, sample) for index, sample in enumerate(samples)]
        batch_size = len(validated)
        lengths = np.fromiter(
            (arrays[0].shape[0] for arrays, _, _ in validated), dtype=np.int64, count=batch_size
        )
        width = _padded_length(int(lengths.max()), self.pad_to_multiple_of)
        max_documents = max(len(v[1]) for v in validated)

        fills = (self.pad_id, IGNORE_INDEX, 0, PAD_DOCUMENT_ID)
        # One tensor holds every [B, L] output (one shared-memory segment per batch from a worker).
        block, seq_lens_tensor = _outputs(len(fills) + 1, batch_size, width, max_documents)
        views = block.numpy()
        outputs = list(views[: len(fills)])
        attention_mask = views[len(fills)]
        seq_lens = seq_lens_tensor.numpy()
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

        batch: dict[str, Any] = {key: block[i] for i, key in enumerate(self._ARRAY_KEYS)}
        batch[ATTENTION_MASK] = block[len(fills)]
        batch[SEQ_LENS] = seq_lens_tensor
        batch[PROVENANCE] = packed_provenance([v[2] for v in validated])
        return batch

    def _collate_packs(self, packs: list[Pack]) -> dict[str, Any]:
        """The batch of the packer's own packs, built in bulk from their pieces.

        Each row's tokens are one concatenation of its pieces, written in place; labels are the
        rows shifted by one with ``-100`` at every piece's end; ``position_ids``/``document_ids``
        come from the piece lengths by one repeat over the whole block, where each row's padding
        is one more segment; provenance is one transpose of the pieces' references. Same batch
        as the per-sample path, bit for bit.
        """
        owner = type(self).__name__
        batch_size = len(packs)
        pack_lengths = [pack.length for pack in packs]
        longest = max(pack_lengths)
        if self.max_seq_len is not None and longest > self.max_seq_len:
            raise ValueError(
                f"{owner}: a pack of {longest} tokens is longer than max_seq_len={self.max_seq_len}. Give "
                "the packer and the collator the same max_seq_len."
            )
        width = _padded_length(longest, self.pad_to_multiple_of)
        refs = [ref for pack in packs for ref in pack.refs]
        pieces = len(refs)
        counts = np.array([len(pack.refs) for pack in packs], dtype=np.int64)
        columns = tuple(zip(*refs))
        lens_list = columns[LENGTH_AT]
        lens = np.array(lens_list, dtype=np.int64)
        arange = self._arange
        pack_of_piece = np.repeat(arange(batch_size), counts)
        first_piece = np.cumsum(counts) - counts
        document_in_pack = arange(pieces) - first_piece[pack_of_piece]

        # Segments of the flattened [B, width] block: each row's pieces, then its padding.
        pad_at = first_piece + counts + arange(batch_size)
        piece_at = arange(pieces) + pack_of_piece
        segment_lens = np.empty(pieces + batch_size, dtype=np.int64)
        segment_lens[piece_at] = lens
        segment_lens[pad_at] = width - np.array(pack_lengths, dtype=np.int64)
        segment_documents = np.empty(pieces + batch_size, dtype=np.int64)
        segment_documents[piece_at] = document_in_pack
        segment_documents[pad_at] = PAD_DOCUMENT_ID
        segment_starts = np.cumsum(segment_lens) - segment_lens
        piece_starts = segment_starts[piece_at]

        fills = (self.pad_id, IGNORE_INDEX, 0, PAD_DOCUMENT_ID)
        block, seq_lens = _outputs(len(fills) + 1, batch_size, width, int(counts.max()))
        views = block.numpy()
        tokens, labels = views[0], views[1]
        for row, (pack, n) in enumerate(zip(packs, pack_lengths)):
            np.concatenate(token_arrays(pack.refs, pack.tokens, pack.stores), out=tokens[row, :n], casting="same_kind")
        labels[:, :-1] = tokens[:, 1:]
        flat_labels = labels.reshape(-1)
        flat_labels[piece_starts + lens - 1] = IGNORE_INDEX
        for pack, first in zip(packs, first_piece.tolist()):
            if pack.extras is not None:  # a masked document carries its own labels
                for index, extra in enumerate(pack.extras, start=first):
                    if extra is not None and extra.labels is not None:
                        start = int(piece_starts[index])
                        flat_labels[start : start + lens_list[index]] = extra.labels
        np.subtract(arange(batch_size * width), np.repeat(segment_starts, segment_lens), out=views[2].reshape(-1))
        views[3].reshape(-1)[:] = np.repeat(segment_documents, segment_lens)
        views[len(fills)].fill(1)
        padding = np.array((*fills, 0), dtype=np.int64)[:, None]
        for row, n in enumerate(pack_lengths):
            if n < width:
                views[:, row, n:] = padding
        seq_lens.numpy()[pack_of_piece, document_in_pack] = lens
        planes = block.unbind(0)
        batch: dict[str, Any] = dict(zip(self._ARRAY_KEYS, planes))
        batch[ATTENTION_MASK] = planes[len(fills)]
        batch[SEQ_LENS] = seq_lens
        batch[PROVENANCE] = {
            SOURCE: list(columns[SOURCE_AT]),
            EPOCH: list(columns[EPOCH_AT]),
            TOKENS: list(lens_list),
            ROW: pack_of_piece.tolist(),
            NEW_DOCUMENT: list(columns[NEW_DOCUMENT_AT]),
            DROPPED_BEFORE: list(columns[DROPPED_AT]),
            TRUNCATED_TOKENS: list(columns[TRUNCATED_AT]),
        }
        return batch

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(pad_id={self.pad_id}, max_seq_len={self.max_seq_len}, "
            f"pad_to_multiple_of={self.pad_to_multiple_of})"
        )
