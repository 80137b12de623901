"""Megatron ``IndexedDataset`` files (Megatron-LM, NeMo, GPT-NeoX): ``.bin`` token ids + ``.idx``.

The ``.idx`` holds, after the header (``MMIDIDX\\x00\\x00``, version ``<Q``, dtype code ``<B``,
sequence count ``<Q``, document count ``<Q``), every sequence's length (int32) and byte pointer
(int64) into the ``.bin``, then the document indices. Each sequence is one document here, as
Megatron's GPT datasets read them. Opening reads the ``.idx`` only; the ``.bin`` is checked by size.
"""

from __future__ import annotations

import struct

import numpy as np

from lightning_tune_data.formats.corpus import CorpusFile
from lightning_tune_data.formats.files import CorpusFiles
from lightning_tune_data.formats.options import FormatOptions

__all__ = ["MEGATRON_DTYPES", "MEGATRON_MAGIC", "open_megatron", "read_megatron_index"]

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
#: Megatron's dtype codes.
MEGATRON_DTYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}
_HEADER = len(MEGATRON_MAGIC) + 8 + 1 + 8 + 8


def read_megatron_index(data: bytes, name: str, description: str) -> tuple[str, np.ndarray, np.ndarray]:
    """``(dtype, sequence lengths, byte pointers)`` of a ``.idx`` file's bytes.

    Raises:
        ValueError: not a Megatron index, or a float dtype (not token ids).
    """
    if data[: len(MEGATRON_MAGIC)] != MEGATRON_MAGIC or len(data) < _HEADER:
        raise ValueError(f"{description}: {name} is not a Megatron index (its header is not MMIDIDX); "
                         "point the source at the .bin/.idx pairs Megatron's preprocessing wrote.")
    code = data[len(MEGATRON_MAGIC) + 8]
    sequences, _ = struct.unpack_from("<QQ", data, len(MEGATRON_MAGIC) + 9)
    dtype = MEGATRON_DTYPES.get(code)
    if dtype is None or dtype.startswith("float"):
        raise ValueError(f"{description}: {name} has dtype code {code} ({dtype or 'unknown'}), not integer token ids.")
    if len(data) < _HEADER + sequences * 12:
        raise ValueError(f"{description}: {name} is truncated ({len(data)} bytes for {sequences} sequences); "
                         "write the index again.")
    lengths = np.frombuffer(data, dtype=np.int32, count=sequences, offset=_HEADER).astype(np.int64)
    pointers = np.frombuffer(data, dtype=np.int64, count=sequences, offset=_HEADER + 4 * sequences)
    return dtype, lengths, pointers


def open_megatron(files: CorpusFiles, names: list[str], options: FormatOptions) -> list[CorpusFile]:
    """Every ``.bin``/``.idx`` pair among ``names``, in name order.

    Raises:
        ValueError: a ``.bin`` without its ``.idx`` (or the reverse), a dtype contradicting the
            ``dtype`` option, non-contiguous sequences, or a ``.bin`` whose size is not the one
            the index says (truncated or overwritten).
    """
    present = set(names)
    result = []
    pairs = [name[:-4] + ".idx" for name in names if name.endswith(".bin") and name[:-4] + ".idx" in present]
    indexes = files.read_many(pairs)
    for name in names:
        if not name.endswith((".bin", ".idx")):
            continue
        stem = name[:-4]
        partner = stem + (".idx" if name.endswith(".bin") else ".bin")
        if partner not in present:
            raise ValueError(f"{options.description}: {files.url(name)} has no {partner.rsplit('/', 1)[-1]} beside it; "
                             "copy the missing file of the pair (Megatron writes both).")
        if name.endswith(".idx"):
            continue
        index = stem + ".idx"
        dtype, lengths, pointers = read_megatron_index(indexes[index], files.url(index), options.description)
        options.check_recorded_dtype(dtype, files.url(index), " (the index says it)")
        width = np.dtype(dtype).itemsize
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        start = int(pointers[0]) if len(pointers) else 0
        if len(pointers) and not np.array_equal(pointers - start, offsets[:-1] * width):
            raise ValueError(f"{options.description}: the sequences of {files.url(index)} are not stored one after "
                             "another in the .bin; write the dataset again with Megatron's IndexedDatasetBuilder.")
        expected = start + int(offsets[-1]) * width
        size = files.listing()[name]["size"]
        if size != expected:
            raise ValueError(f"{options.description}: {files.url(name)} has {size} bytes but its index says {expected} "
                             "(truncated or overwritten); copy the .bin again or rebuild the pair.")
        result.append(CorpusFile(files.url(name), dtype, offsets, path=files.local(name), start=start,
                                 identity=[files.identity(name), files.identity(index)]))
    return result
