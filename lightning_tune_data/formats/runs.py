"""Token runs scattered in a file's bytes, gathered into one token array with NumPy.

An MDS sample or a LitData item holds its ids as one contiguous run, after a few header bytes
(per-sample column sizes, an ndarray's shape, a leaf size) and beside other columns. Where those
headers leave the runs unaligned to the id width (an ``int32`` run after a 3-byte shape header)
or a shard is compressed, the runs are copied out once into one aligned array, whatever each
run's alignment, by one of two NumPy copies (no decoding per sample): runs of a few dozen bytes
or more are sliced out of the bytes and joined (``np.concatenate``); shorter ones are selected by
a mask of the bytes inside runs (a cumulative sum of +1 at each run's start and -1 at its end),
which costs per byte instead of per run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["gather_runs", "read_u32_at"]

#: Bytes per run below which the byte mask beats joining one slice per run (measured: the mask
#: costs about 3 ns per byte, a slice about 250 ns per run; equal near 20 ``int32`` ids a run).
_MASK_BYTES_PER_RUN = 80


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
        starts: each run's first byte, increasing (runs do not overlap).
        counts: each run's id count.
        dtype: the ids' dtype.

    Raises:
        ValueError: a run reaches beyond ``data`` or into the next run (the file is truncated or
            its headers are wrong).
    """
    dtype = np.dtype(dtype)
    raw = np.frombuffer(data, np.uint8)
    starts = np.asarray(starts, dtype=np.int64)
    ends = starts + np.asarray(counts, dtype=np.int64) * dtype.itemsize
    if len(starts) and (int(starts[0]) < 0 or int(ends[-1]) > len(raw) or np.any(starts[1:] < ends[:-1])):
        raise ValueError(f"a run of ids reaches beyond the {len(raw)} bytes read, or into the next one")
    present = ends > starts  # empty runs add nothing (and would share a start with the next run)
    starts, ends = starts[present], ends[present]
    if not len(starts):
        return np.zeros(0, dtype)
    first, last = int(starts[0]), int(ends[-1])
    if (last - first) > _MASK_BYTES_PER_RUN * len(starts):  # long runs: one slice each, joined
        return np.concatenate([raw[a:b] for a, b in zip(starts.tolist(), ends.tolist())]).view(dtype)
    # short runs: a byte is kept from a run's start up to its end (+1 at each start, -1 at each end, summed)
    edges = np.zeros(last - first + 1, dtype=np.int8)
    edges[starts - first] += 1
    edges[ends - first] -= 1
    keep = np.cumsum(edges[:-1], dtype=np.int8).view(bool)
    return raw[first:last][keep].view(dtype)
