"""Batch tensors that a dataloader worker builds directly in shared memory.

A batch leaves a dataloader worker through a queue; torch moves every tensor that is not yet in
shared memory into a new shared-memory segment on the way (a copy of the whole batch) and frees
the original. Built in ordinary memory, a batch buffer of a few hundred KB to a few MB whose
size changes from batch to batch is therefore allocated and freed once per batch. glibc's
``malloc`` serves buffers of that size from its main heap (its mmap threshold has risen above
them by then), the freed blocks of ever-different sizes fragment the heap, and each worker's
anonymous memory grows by 100-250 MB in the first part of a run before it levels off.

:func:`batch_tensor` allocates the buffer in shared memory from the start when it runs in a
dataloader worker, as ``torch.utils.data.default_collate`` does: no heap block, no copy on the
way out. In the main process (``num_workers=0``) it is NumPy memory wrapped once (torch's own
allocation costs more inside the dataloader's per-batch profiling scope). :func:`batch_planes`
hands out such a block's planes as separate tensors.

:func:`batch_parts` is for compact batches (int32 token ids, int64 lengths, a bool mask: a few tens
of KB). In a dataloader worker it hands out plain NumPy arrays, which the worker's queue pickles
inline: for buffers this small that costs both processes less than a shared-memory segment, whose
file descriptor travels through a separate socket handshake with the worker (measured in
``benchmarks/bench_main_process.py``). The train loader wraps them as tensors in the main process.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info


_NUMPY_DTYPES: dict[torch.dtype, np.dtype] = {}


def batch_planes(shape: tuple[int, ...], dtype: torch.dtype = torch.int64) -> tuple[np.ndarray, tuple[torch.Tensor, ...]]:
    """An uninitialised block of ``shape`` as a NumPy array, and its planes (``block[i]``) as tensors
    sharing its memory.

    In a dataloader worker the planes are views of one shared-memory tensor (:func:`batch_tensor`),
    so the batch leaves the worker as one segment. In the main process each plane wraps the array's
    plane: one ``torch.from_numpy`` per plane cost ~15 µs less per batch than ``unbind`` of one
    tensor, measured in the in-process train loop (torch's dispatch runs cold between batches).

    Args:
        shape: the block's shape; its planes are ``block[i]`` along the first dimension.
        dtype: the block's dtype.
    """
    if get_worker_info() is None:
        block = np.empty(shape, dtype=_numpy_dtype(dtype))
        return block, tuple(map(torch.from_numpy, block))
    tensor = batch_tensor(shape, dtype)
    return tensor.numpy(), tensor.unbind(0)


def _numpy_dtype(dtype: torch.dtype) -> np.dtype:
    numpy_dtype = _NUMPY_DTYPES.get(dtype)
    if numpy_dtype is None:
        numpy_dtype = _NUMPY_DTYPES[dtype] = torch.empty(0, dtype=dtype).numpy().dtype
    return numpy_dtype


def batch_tensor(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised tensor of ``shape`` and ``dtype``; in shared memory inside a dataloader worker.

    Args:
        shape: the tensor's shape.
        dtype: the tensor's dtype.
    """
    if get_worker_info() is None:
        return torch.from_numpy(np.empty(shape, dtype=_numpy_dtype(dtype)))
    empty = torch.empty(0, dtype=dtype)
    storage = empty._typed_storage()._new_shared(math.prod(shape))  # the sharing strategy's own allocator
    return empty.new(storage).view(shape)


#: Byte alignment of each part of :func:`batch_parts` (the widest dtype a part has).
_PART_ALIGNMENT = 8


def batch_parts(parts: Sequence[tuple[tuple[int, ...], np.dtype]]) -> tuple[list[np.ndarray], list[Any]]:
    """Uninitialised arrays of the given shapes and dtypes in one buffer, and what a batch carries
    of them: tensors sharing their memory in the main process, the arrays themselves in a
    dataloader worker (pickled inline on the way out; see the module docstring).

    Args:
        parts: ``(shape, dtype)`` of each part, in order (dtypes of at most 8 bytes per item).
    """
    offsets, total = [], 0
    for shape, dtype in parts:
        offsets.append(total)
        total += -(-math.prod(shape) * np.dtype(dtype).itemsize // _PART_ALIGNMENT) * _PART_ALIGNMENT
    buffer = np.empty(max(total, 1), dtype=np.uint8)
    arrays = [buffer[offset: offset + math.prod(shape) * np.dtype(dtype).itemsize].view(dtype).reshape(shape)
              for (shape, dtype), offset in zip(parts, offsets)]
    if get_worker_info() is not None:
        return arrays, arrays
    return arrays, [torch.from_numpy(array) for array in arrays]
