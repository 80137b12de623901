"""What both collators share: the label shift, argument and sample checks, and a cached range.

The batch and provenance keys they write are defined once in :mod:`lightning_tune_data.keys`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from lightning_tune_data.keys import EPOCH, NEW_DOCUMENT, SOURCE, TOKENS
from lightning_tune_data.packing.pieces import document_labels

#: Columns kept in the collators' per-width caches (they grow for wider batches).
CACHED_WIDTH = 1 << 12

#: Keys each per-document provenance entry of a packed sample must have.
PACKED_PROVENANCE_KEYS = (SOURCE, EPOCH, TOKENS, NEW_DOCUMENT)


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
    mask = None
    if loss_mask is not None:
        mask = np.asarray(loss_mask, dtype=bool)
        if mask.shape != ids.shape:
            raise ValueError(
                f"shifted_labels: loss_mask has shape {mask.shape} but input_ids has shape "
                f"{ids.shape}; they must describe the same tokens."
            )
    return document_labels(ids, mask)


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


def padded_length(longest: int, pad_to_multiple_of: int | None) -> int:
    """``longest`` rounded up to a multiple of ``pad_to_multiple_of`` (if given).

    Args:
        longest: the longest row of a batch (tokens).
        pad_to_multiple_of: the multiple to round up to; ``None``: no rounding.
    """
    if pad_to_multiple_of is None:
        return longest
    return -(-longest // pad_to_multiple_of) * pad_to_multiple_of


def one_d_array(owner: str, index: int, key: str, value: Any, integer: bool = True) -> np.ndarray:
    """``value`` as a 1-D (integer) array, or a ValueError naming the sample and the key.

    Args:
        owner: the collator's name, first in every message.
        index: the sample's position in the batch.
        key: the field ``value`` was read from.
        value: the field's value (an array, or anything ``np.asarray`` reads).
        integer: whether the array must hold integers (token ids; a loss mask need not).
    """
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


def count_field(owner: str, index: int, sample: Mapping[str, Any], key: str) -> int:
    """An optional non-negative int field of a sample or provenance entry (absent or None: 0).

    Args:
        owner: the collator's name, first in every message.
        index: the sample's position in the batch.
        sample: the sample or provenance entry.
        key: the field to read.
    """
    value = sample.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(
            f"{owner}: sample {index} field {key!r} must be a non-negative int, got {value!r}; it counts "
            "tokens or documents removed by the length policy."
        )
    return int(value)


def required_field(owner: str, index: int, sample: Mapping[str, Any], key: str, what: str) -> Any:
    """Field ``key`` of ``sample``, or a ValueError naming the sample, the key and the keys it has.

    Args:
        owner: the collator's name, first in every message.
        index: the sample's position in the batch.
        sample: the sample or provenance entry.
        key: the field to read.
        what: why the field must be there (the end of the message).
    """
    try:
        return sample[key]
    except KeyError:
        raise ValueError(
            f"{owner}: sample {index} has no {key!r} field (keys: {sorted(sample)}); {what}"
        ) from None


class ArangeCache:
    """``0..n-1`` as views of one cached array, regrown when a longer range is asked for: no
    allocation per batch. It pickles empty (a collator crossing to a worker carries no cache)."""

    __slots__ = ("_values",)

    def __init__(self) -> None:
        self._values: np.ndarray | None = None

    def __call__(self, n: int) -> np.ndarray:
        values = self._values
        if values is None or values.shape[0] < n:
            values = self._values = np.arange(max(n, CACHED_WIDTH), dtype=np.int64)
        return values[:n]

    def __reduce__(self) -> tuple:
        return (ArangeCache, ())


def checked_collator_options(owner: str, pad_id: int, max_seq_len: int | None,
                             pad_to_multiple_of: int | None) -> tuple[int, int | None, int | None]:
    """``(pad_id, max_seq_len, pad_to_multiple_of)`` after the checks every collator applies.

    Args:
        owner: the collator's name, first in every message.
        pad_id: the tokenizer's pad id (an int).
        max_seq_len, pad_to_multiple_of: positive ints, or ``None``.
    """
    return (_check_pad_id(owner, pad_id), _check_optional_positive(owner, "max_seq_len", max_seq_len),
            _check_optional_positive(owner, "pad_to_multiple_of", pad_to_multiple_of))
