"""Token runs scattered in a file's bytes, gathered into one token array with NumPy.

An MDS sample or a LitData item holds its ids as one contiguous run, after a few header bytes
(per-sample column sizes, an ndarray's shape, a leaf size) and beside other columns. Those
headers leave the runs at byte positions that are not multiples of the id width (an ``int32``
run after a 3-byte shape header), and with gaps between them, so the runs cannot be one Arrow
``large_list`` over the file: they are copied out once into one aligned array. The copy is
vectorised: the runs are grouped by their byte position modulo the id width, each group read
through one typed view of the bytes shifted by that remainder, a few million ids at a time (no
Python loop per sample).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["gather_runs", "read_u32_at"]

#: Ids gathered per step (bounds the index arrays a step builds: 16 bytes per id).
_STEP_IDS = 1 << 22


def read_u32_at(data: Any, positions: np.ndarray) -> np.ndarray:
    """The little-endian ``uint32`` at each byte position of ``data`` (any alignment), as int64.

    Args:
        data: the bytes (``bytes``, ``memoryview`` or a ``uint8`` array).
        positions: byte positions (an integer array).
    """
    raw = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data
    at = np.asarray(positions, dtype=np.int64)
    if len(at) and (int(at.min()) < 0 or int(at.max()) + 4 > len(raw)):
        raise ValueError(f"a size header at byte {int(at.max())} lies beyond the {len(raw)} bytes read")
    value = np.zeros(len(at), dtype=np.int64)
    for byte in range(4):
        value |= raw[at + byte].astype(np.int64) << (8 * byte)
    return value


def gather_runs(data: Any, starts: np.ndarray, counts: np.ndarray, dtype: str | np.dtype) -> np.ndarray:
    """The ids of every run, joined in run order.

    Args:
        data: the bytes holding the runs.
        starts: each run's first byte.
        counts: each run's id count.
        dtype: the ids' dtype.

    Raises:
        ValueError: a run reaches beyond ``data`` (the file is truncated or its headers are wrong).
    """
    dtype = np.dtype(dtype)
    width = dtype.itemsize
    raw = np.frombuffer(data, np.uint8)
    starts = np.asarray(starts, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    if len(starts) and (int(starts.min()) < 0 or int((starts + counts * width).max()) > len(raw)):
        raise ValueError(f"a run of ids reaches beyond the {len(raw)} bytes read")
    ends = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    out = np.empty(int(ends[-1]), dtype=dtype)
    remainders = starts % width
    for remainder in np.unique(remainders).tolist():
        view = np.frombuffer(raw.data, dtype, (len(raw) - remainder) // width, remainder)
        picked = np.flatnonzero(remainders == remainder)
        first = 0
        while first < len(picked):
            # runs of this step: a few million ids at most (one run alone when it is larger)
            reach = np.cumsum(counts[picked[first:]])
            last = first + max(1, int(np.searchsorted(reach, _STEP_IDS, side="right")))
            runs = picked[first:last]
            lengths = counts[runs]
            total = int(lengths.sum())
            if total:
                within = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
                target = np.repeat(ends[runs], lengths) + within
                source = np.repeat((starts[runs] - remainder) // width, lengths) + within
                out[target] = view[source]
            first = last
    return out
