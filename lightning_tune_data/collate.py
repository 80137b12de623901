"""Collators: turn lists of samples into batches of tensors plus a provenance side channel.

Both collators run inside dataloader workers on the hot path, so they write every output of a
batch into one preallocated tensor through its numpy views, with a few whole-batch operations
(never a Python loop per token): the documents' tokens are concatenated once and scattered into
their rows, labels are the padded ids shifted by one wherever there is a target.

The label contract: ``labels`` are **already shifted**. The label at
position ``i`` is the token the model must predict at position ``i``, i.e. ``input_ids[i + 1]``
of the *same document*, or ``-100`` (ignored) where there is no target: at each document's last
token, on padding, and where the next token is a masked prompt token.

The provenance side channel is a dict of plain Python lists with one entry per document in the
batch (``source``, ``epoch``, ``tokens``, ``row``, ``new_document``; packed batches also carry
every other key of the packer's per-document provenance, such as ``truncated_tokens`` and
``dropped_before``). It is small, crosses the worker boundary cheaply, and feeds the per-source
metrics and per-source losses in the main process.

``PackedCollator`` builds a batch of the packer's own packs (``PackedSample``) in bulk from their
document pieces; any other packed samples (plain dicts) are validated and copied row by row.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from lightning_tune_data.streams.base import DROPPED_BEFORE, EPOCH, INPUT_IDS, LOSS_MASK, SOURCE, TRUNCATED_TOKENS
from lightning_tune_data.streams.pack_pieces import (
    DROPPED_AT,
    EPOCH_AT,
    LENGTH_AT,
    NEW_DOCUMENT_AT,
    SOURCE_AT,
    TRUNCATED_AT,
    Pack,
    PackedSample,
)
from lightning_tune_data.worker_memory import batch_tensor

#: Label value that the loss ignores (``torch.nn.CrossEntropyLoss``'s default ``ignore_index``).
IGNORE_INDEX = -100

#: Batch keys.
LABELS = "labels"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
DOCUMENT_IDS = "document_ids"
SEQ_LENS = "seq_lens"
PROVENANCE = "provenance"

#: Provenance keys (``SOURCE`` and ``EPOCH`` are shared with document samples).
TOKENS = "tokens"
ROW = "row"
NEW_DOCUMENT = "new_document"

#: ``document_ids`` value on padding positions of a packed batch.
PAD_DOCUMENT_ID = -1

#: Columns kept in the padded collator's per-width caches (they grow for wider batches).
_CACHED_WIDTH = 1 << 12

#: Keys each per-document provenance entry of a packed sample must have.
_PACKED_PROVENANCE_KEYS = (SOURCE, EPOCH, TOKENS, NEW_DOCUMENT)

__all__ = [
    "ATTENTION_MASK",
    "DOCUMENT_IDS",
    "DROPPED_BEFORE",
    "EPOCH",
    "IGNORE_INDEX",
    "INPUT_IDS",
    "LABELS",
    "LOSS_MASK",
    "NEW_DOCUMENT",
    "PAD_DOCUMENT_ID",
    "POSITION_IDS",
    "PROVENANCE",
    "PackedCollator",
    "PaddedCollator",
    "ROW",
    "SEQ_LENS",
    "SOURCE",
    "TOKENS",
    "TRUNCATED_TOKENS",
    "shifted_labels",
]


def shifted_labels(input_ids: np.ndarray, loss_mask: np.ndarray | None = None) -> np.ndarray:
    """Labels of one document, already shifted for next-token prediction.

    ``labels[i] = input_ids[i + 1]`` if ``loss_mask[i + 1]`` (or when there is no mask), else
    ``-100``; ``labels[-1] = -100`` because the document's last token has no next token *in this
    document*. Computing labels per document (never over a packed row) is what keeps a label
    from crossing a document boundary.

    Args:
        input_ids: 1-D integer array of one document's token ids.
        loss_mask: optional 1-D bool array of the same length; ``True`` where the token is a
            training target (prompt tokens are ``False``). ``None`` means every token is a target.

    Returns:
        A new 1-D ``int64`` array of the same length as ``input_ids``.

    Raises:
        ValueError: the arrays are not 1-D or their lengths differ.
    """
    ids = np.asarray(input_ids)
    if ids.ndim != 1:
        raise ValueError(f"shifted_labels: input_ids must be 1-D, got shape {ids.shape}.")
    labels = np.full(ids.shape[0], IGNORE_INDEX, dtype=np.int64)
    if ids.shape[0] == 0:
        return labels
    labels[:-1] = ids[1:]
    if loss_mask is not None:
        mask = np.asarray(loss_mask, dtype=bool)
        if mask.shape != ids.shape:
            raise ValueError(
                f"shifted_labels: loss_mask has shape {mask.shape} but input_ids has shape "
                f"{ids.shape}; they must describe the same tokens."
            )
        labels[:-1][~mask[1:]] = IGNORE_INDEX
    return labels


def _check_optional_positive(owner: str, name: str, value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{owner}: {name} must be a positive int or None, got {value!r}.")
    return int(value)


def _check_pad_id(owner: str, pad_id: int) -> int:
    if isinstance(pad_id, bool) or not isinstance(pad_id, (int, np.integer)):
        raise ValueError(
            f"{owner}: pad_id must be an int (the tokenizer's pad_id), got {pad_id!r}."
        )
    return int(pad_id)


def _padded_length(longest: int, pad_to_multiple_of: int | None) -> int:
    """``longest`` rounded up to a multiple of ``pad_to_multiple_of`` (if given)."""
    if pad_to_multiple_of is None:
        return longest
    return -(-longest // pad_to_multiple_of) * pad_to_multiple_of


def _one_d(owner: str, index: int, key: str, value: Any, integer: bool = True) -> np.ndarray:
    """``value`` as a 1-D (integer) array, or a ValueError naming the sample and the key."""
    if type(value) is np.ndarray and value.ndim == 1 and (not integer or value.dtype.kind in "iu"):
        return value  # the common case, checked cheaply (this runs per document on the hot path)
    array = np.asarray(value)
    if array.ndim != 1:
        raise ValueError(
            f"{owner}: sample {index} field {key!r} must be a 1-D array, got shape {array.shape}."
        )
    if integer and array.size and not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            f"{owner}: sample {index} field {key!r} must hold integers, got dtype "
            f"{array.dtype}; token ids are integer arrays (e.g. np.int32)."
        )
    return array


def _count(owner: str, index: int, sample: Mapping[str, Any], key: str) -> int:
    """An optional non-negative int field of a sample or provenance entry (absent or None: 0)."""
    value = sample.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(
            f"{owner}: sample {index} field {key!r} must be a non-negative int, got {value!r}; it counts "
            "tokens or documents removed by the length policy."
        )
    return int(value)


def _required(owner: str, index: int, sample: Mapping[str, Any], key: str, what: str) -> Any:
    try:
        return sample[key]
    except KeyError:
        raise ValueError(
            f"{owner}: sample {index} has no {key!r} field (keys: {sorted(sample)}); {what}"
        ) from None


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
    ``truncated_tokens`` plus any tokens cut here) and ``dropped_before`` (the sample's,
    default 0), one entry per row.

    Args:
        pad_id: token id written on padding positions (the tokenizer's ``pad_id``).
        max_seq_len: longest document kept; longer ones are truncated. ``None``: no limit.
        pad_to_multiple_of: round the padded length up to a multiple of this (e.g. 8 for tensor
            cores, or a context-parallel divisor). The rounding can exceed ``max_seq_len``; the
            extra positions are padding.
    """

    def __init__(
        self,
        pad_id: int,
        max_seq_len: int | None = None,
        pad_to_multiple_of: int | None = None,
    ) -> None:
        owner = type(self).__name__
        self.pad_id = _check_pad_id(owner, pad_id)
        self.max_seq_len = _check_optional_positive(owner, "max_seq_len", max_seq_len)
        self.pad_to_multiple_of = _check_optional_positive(
            owner, "pad_to_multiple_of", pad_to_multiple_of
        )
        self._positions: np.ndarray | None = None
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
        block = self._block(lengths, tokens, masks)
        batch_size = len(lengths)
        input_ids, labels, attention_mask, position_ids = block.unbind(0)
        return {
            INPUT_IDS: input_ids,
            LABELS: labels,
            ATTENTION_MASK: attention_mask,
            POSITION_IDS: position_ids,
            PROVENANCE: {
                SOURCE: sources,
                EPOCH: epochs,
                TOKENS: lengths,
                ROW: list(range(batch_size)),
                NEW_DOCUMENT: [True] * batch_size,
                TRUNCATED_TOKENS: truncated,
                DROPPED_BEFORE: dropped,
            },
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
            tokens = np.concatenate(ids_list)
        except (AttributeError, KeyError, TypeError, ValueError):
            return None
        if tokens.dtype.kind not in "iu" or any(dtype.kind not in "iu" for dtype in dtypes) or tokens.ndim != 1 \
                or tokens.shape[0] != sum(lengths):
            return None  # not all 1-D integer arrays: the per-sample checks say which sample and why
        owner = type(self).__name__
        if TRUNCATED_TOKENS in optional:
            truncated = [_count(owner, i, sample, TRUNCATED_TOKENS) for i, sample in enumerate(samples)]
            if cut is not None:
                truncated = [count + extra for count, extra in zip(truncated, cut)]
        else:
            truncated = cut if cut is not None else [0] * len(samples)
        if DROPPED_BEFORE in optional:
            dropped = [_count(owner, i, sample, DROPPED_BEFORE) for i, sample in enumerate(samples)]
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
            ids = _one_d(
                owner, index, INPUT_IDS,
                _required(owner, index, sample, INPUT_IDS, "document samples need token ids."),
            )
            mask = sample.get(LOSS_MASK)
            if mask is not None:
                mask = _one_d(owner, index, LOSS_MASK, mask, integer=False)
                if mask.shape != ids.shape:
                    raise ValueError(
                        f"{owner}: sample {index} has {ids.shape[0]} input_ids but "
                        f"{mask.shape[0]} loss_mask entries; they must describe the same tokens."
                    )
                mask = mask.astype(bool, copy=False)
            cut = _count(owner, index, sample, TRUNCATED_TOKENS)
            if self.max_seq_len is not None and ids.shape[0] > self.max_seq_len:
                cut += ids.shape[0] - self.max_seq_len
                ids = ids[: self.max_seq_len]
                mask = None if mask is None else mask[: self.max_seq_len]
            ids_list.append(ids)
            masks.append(mask)
            source = _required(owner, index, sample, SOURCE, "the stream sets the source name.")
            epoch = _required(owner, index, sample, EPOCH, "the stream sets the source's pass.")
            sources.append(str(source))
            epochs.append(int(epoch))
            truncated.append(cut)
            dropped.append(_count(owner, index, sample, DROPPED_BEFORE))
        # Each document's ids cast to int64 on their own (exactly what a row-by-row copy writes).
        total = sum(ids.shape[0] for ids in ids_list)
        tokens = np.concatenate(ids_list, out=np.empty(total, dtype=np.int64), casting="unsafe")
        lengths = [ids.shape[0] for ids in ids_list]
        any_mask = any(mask is not None for mask in masks)
        return lengths, tokens, masks if any_mask else None, sources, epochs, truncated, dropped

    def _block(
        self, lengths: list[int], tokens: np.ndarray, masks: Sequence[np.ndarray | None] | None
    ) -> torch.Tensor:
        """The ``[4, B, L]`` block: input_ids, labels, attention_mask and position_ids.

        ``tokens`` are the documents' ids concatenated; the row-major "real token" mask scatters
        them into their rows in one pass. Labels are the padded ids shifted by one, copied only
        where the next position holds a target (a real token, not masked): every document end,
        padding position and masked target keeps ``-100``.
        """
        batch_size = len(lengths)
        width = _padded_length(max(lengths), self.pad_to_multiple_of)
        # One tensor holds all four outputs: a batch then crosses from a dataloader worker in one
        # shared-memory segment instead of four, built there directly (see worker_memory).
        tensor = batch_tensor((4, batch_size, width), torch.int64)
        block = tensor.numpy()
        input_ids, labels, attention_mask, position_ids = block
        real = self._real_tokens(lengths, width)  # [B, L]: True on real tokens
        np.copyto(attention_mask, real)
        np.multiply(self._columns(width), attention_mask, out=position_ids)
        input_ids.fill(self.pad_id)
        input_ids[real] = tokens
        targets = real
        if masks is not None:
            targets = np.zeros((batch_size, width), dtype=bool)
            targets[real] = np.concatenate(
                [np.ones(n, dtype=bool) if mask is None else mask for n, mask in zip(lengths, masks)]
            )
        labels.fill(IGNORE_INDEX)
        np.copyto(labels[:, :-1], input_ids[:, 1:], where=targets[:, 1:])
        return tensor

    def _columns(self, width: int) -> np.ndarray:
        """``0..width-1`` from a cached array (no fresh allocation per batch)."""
        cached = self._positions
        if cached is None or cached.shape[0] < width:
            cached = self._positions = np.arange(max(width, _CACHED_WIDTH), dtype=np.int64)
        return cached[:width]

    def _real_tokens(self, lengths: list[int], width: int) -> np.ndarray:
        """``[B, width]`` bool: ``True`` at the columns below each row's length.

        Each row is copied from a cached read-only window over ``size`` ``True`` then ``size``
        ``False`` values (row ``size - n`` starts with ``n`` ``True``), which is cheaper than a
        broadcast comparison over the whole batch.
        """
        window = self._windows
        if window is None or window.shape[1] < width:
            size = max(width, _CACHED_WIDTH)
            base = np.zeros(2 * size, dtype=bool)
            base[:size] = True
            window = self._windows = np.lib.stride_tricks.as_strided(
                base, shape=(size + 1, size), strides=(1, 1), writeable=False
            )
        return window[np.subtract(window.shape[1], lengths), :width]

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_positions": None, "_windows": None}  # caches are rebuilt on first use

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(pad_id={self.pad_id}, max_seq_len={self.max_seq_len}, "
            f"pad_to_multiple_of={self.pad_to_multiple_of})"
        )


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
        owner = type(self).__name__
        self.pad_id = _check_pad_id(owner, pad_id)
        self.max_seq_len = _check_optional_positive(owner, "max_seq_len", max_seq_len)
        self.pad_to_multiple_of = _check_optional_positive(
            owner, "pad_to_multiple_of", pad_to_multiple_of
        )

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
        block = batch_tensor((len(fills) + 1, batch_size, width), torch.int64)
        views = block.numpy()
        outputs = list(views[: len(fills)])
        attention_mask = views[len(fills)]
        seq_lens = np.zeros((batch_size, max_documents), dtype=np.int64)
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
        batch[SEQ_LENS] = torch.from_numpy(seq_lens)
        batch[PROVENANCE] = packed_provenance([v[2] for v in validated])
        return batch

    def _arange(self, n: int) -> np.ndarray:
        """``0..n-1`` from a cached array (no fresh allocation per batch)."""
        cached = getattr(self, "_positions", None)
        if cached is None or cached.shape[0] < n:
            cached = self._positions = np.arange(max(n, 1 << 12), dtype=np.int64)
        return cached[:n]

    def _collate_packs(self, packs: list[Pack]) -> dict[str, Any]:
        """The batch of the packer's own packs, built in bulk from their pieces.

        One concatenation gathers every piece's tokens; labels are that stream shifted by one
        with ``-100`` at every piece's end; ``position_ids``/``document_ids`` come from the piece
        lengths (repeat); provenance is one transpose of the pieces'
        references. Rows shorter than the batch are copied into place row by row. Same batch as
        the per-sample path, bit for bit.
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
        counts = np.array([len(pack.refs) for pack in packs], dtype=np.int64)
        columns = tuple(zip(*refs))
        lens_list = columns[LENGTH_AT]
        lens = np.array(lens_list, dtype=np.int64)
        total = sum(pack_lengths)
        piece_ends = np.cumsum(lens)
        first_piece = np.cumsum(counts) - counts
        pack_of_piece = np.repeat(self._arange(batch_size), counts)
        document_in_pack = self._arange(len(refs)) - first_piece[pack_of_piece]

        fills = (self.pad_id, IGNORE_INDEX, 0, PAD_DOCUMENT_ID)
        block = batch_tensor((len(fills) + 1, batch_size, width), torch.int64)
        views = block.numpy()
        full = total == batch_size * width  # every row full (concat): build straight into the outputs
        compact = views[: len(fills)].reshape(len(fills), -1) if full else np.empty((len(fills), total), np.int64)
        tokens, labels, positions, documents = compact
        np.concatenate([piece for pack in packs for piece in pack.tokens], out=tokens, casting="same_kind")
        labels[:-1] = tokens[1:]
        labels[piece_ends - 1] = IGNORE_INDEX
        for pack, first in zip(packs, first_piece.tolist()):
            if pack.extras is not None:  # a masked document carries its own labels
                for index, extra in enumerate(pack.extras, start=first):
                    if extra is not None and extra.labels is not None:
                        end = int(piece_ends[index])
                        labels[end - lens_list[index] : end] = extra.labels
        np.subtract(self._arange(total), np.repeat(piece_ends - lens, lens), out=positions)
        documents[:] = np.repeat(document_in_pack, lens)
        if full:
            views[len(fills)].fill(1)
        else:
            padding = np.array((*fills, 0), dtype=np.int64)[:, None]
            start = 0
            for row, n in enumerate(pack_lengths):
                views[: len(fills), row, :n] = compact[:, start : start + n]
                views[len(fills), row, :n] = 1
                views[:, row, n:] = padding
                start += n
        seq_lens = np.zeros((batch_size, int(counts.max())), dtype=np.int64)
        seq_lens[pack_of_piece, document_in_pack] = lens
        planes = block.unbind(0)
        batch: dict[str, Any] = dict(zip(self._ARRAY_KEYS, planes))
        batch[ATTENTION_MASK] = planes[len(fills)]
        batch[SEQ_LENS] = torch.from_numpy(seq_lens)
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
