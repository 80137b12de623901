"""LitData optimized datasets (``litdata.optimize``, litgpt recipes): ``index.json`` + ``chunk-*.bin``.

A chunk is ``uint32`` item count, ``uint32`` byte offsets of its items (count + 1), then the items.
With litgpt's ``TokensLoader`` each item is one document's raw ids, back to back: the chunk is read
in place, the offsets being the document boundaries. With the default ``PyTreeLoader`` an item of
one 1-D array is a ``uint32`` size then the ids: the chunk is read in place too, as list views
(each document a position and a length, the sizes between them never read as ids). Only the
index and the chunk headers are read to open either.

Ids the header leaves unaligned (8-byte ids after an odd number of header words) are copied out
with NumPy: once per node into a kept token file (:mod:`lightning_tune_data.formats.kept`), or, for
a remote corpus with a ``cache_budget`` (whose chunks are then all read through the node's shard
cache), chunk by chunk when fetched. ``PyTreeLoader`` chunks of such a remote corpus are decoded
the same way (the node cache holds documents back to back). Compressed or encrypted chunks are refused.
"""

from __future__ import annotations

import json
from functools import partial

import numpy as np

from lightning_tune_data.formats.corpus import CorpusFile
from lightning_tune_data.formats.files import CorpusFiles
from lightning_tune_data.formats.kept import kept_arrays, kept_folder, kept_path
from lightning_tune_data.formats.options import FormatOptions
from lightning_tune_data.formats.runs import gather_runs

__all__ = ["is_litdata_index", "open_litdata", "pytree_tokens", "tokens_loader_tokens"]

#: LitData's ``no_header_tensor:<k>`` codes (torch dtypes) and ``no_header_numpy:<k>`` codes.
_TENSOR_DTYPES = {11: "uint8", 12: "int8", 13: "int16", 14: "int16", 15: "int32", 16: "int32", 17: "int64",
                  18: "int64", 20: "uint16"}
_NUMPY_DTYPES = {0: "int8", 1: "int16", 2: "int32", 3: "int64", 4: "uint8", 5: "uint16", 6: "uint32", 7: "uint64"}


def is_litdata_index(content: object) -> bool:
    """Whether a parsed ``index.json`` is LitData's (``chunks`` and ``config``)."""
    return isinstance(content, dict) and isinstance(content.get("chunks"), list) and "config" in content


def _leaf_dtype(config: dict, where: str, options: FormatOptions) -> str:
    formats = config.get("data_format") or []
    if len(formats) != 1 or ":" not in str(formats[0]):
        raise ValueError(f"{options.description}: {where} describes items of {formats}; a token dataset's items are one "
                         "1-D array of ids each (optimize with a function returning one tensor or array).")
    kind, code = str(formats[0]).split(":", 1)
    table = {"no_header_tensor": _TENSOR_DTYPES, "no_header_numpy": _NUMPY_DTYPES}.get(kind, {})
    dtype = table.get(int(code)) if code.isdigit() else None
    if dtype is None:
        raise ValueError(f"{options.description}: {where} items are {formats[0]}, not integer token ids.")
    options.check_recorded_dtype(dtype, where)
    return dtype


def pytree_tokens(data: bytes, dtype: str) -> np.ndarray:
    """A ``PyTreeLoader`` chunk's ids (each item a ``uint32`` leaf size, then the ids), every item
    at once, joined.

    Args:
        data: the chunk's bytes.
        dtype: the ids' dtype.
    """
    offsets = _item_bytes(data)
    return gather_runs(data, offsets[:-1] + 4, _pytree_counts(offsets, dtype), dtype)


def tokens_loader_tokens(data: bytes, dtype: str) -> np.ndarray:
    """A ``TokensLoader`` chunk's ids, copied out aligned (a header of an odd number of words
    leaves 8-byte ids unaligned in the file).

    Args:
        data: the chunk's bytes.
        dtype: the ids' dtype.
    """
    offsets = _item_bytes(data)
    return np.frombuffer(data[int(offsets[0]) : int(offsets[-1])], dtype=dtype).copy()


def _item_bytes(data: bytes) -> np.ndarray:
    """A chunk's item byte offsets (count + 1), from its header."""
    count = int(np.frombuffer(data, "<u4", 1)[0])
    return np.frombuffer(data, "<u4", count + 1, 4).astype(np.int64)


def _pytree_counts(offsets: np.ndarray, dtype: str) -> np.ndarray:
    """Each ``PyTreeLoader`` item's id count from the chunk's item byte offsets (less its leaf size)."""
    return (np.diff(offsets) - 4) // np.dtype(dtype).itemsize


def open_litdata(files: CorpusFiles, names: list[str], options: FormatOptions) -> list[CorpusFile]:
    """The chunks of every LitData ``index.json`` among ``names``, in index order.

    Raises:
        ValueError: compressed or encrypted chunks, items that are not one integer array, a chunk
            listed but missing, or a chunk whose header does not match the index.
    """
    listing = files.listing()
    indexes = [name for name in names if name.rsplit("/", 1)[-1] == "index.json"]
    contents = {index: json.loads(data) for index, data in files.read_many(indexes).items()}  # once per node
    chunks: list[tuple[str, str, str, bool, np.ndarray]] = []  # (index, chunk, dtype, tokens loader, header)
    for index in indexes:
        content = contents[index]
        if not is_litdata_index(content):
            continue
        where, config = files.url(index), content.get("config") or {}
        if config.get("compression") or config.get("encryption"):
            raise ValueError(f"{options.description}: {where} holds compressed or encrypted chunks; optimize the "
                             "dataset again with compression=None to read it in place.")
        dtype = _leaf_dtype(config, where, options)
        tokens_loader = config.get("item_loader") == "TokensLoader"
        folder = index.rsplit("/", 1)[0]
        missing = [chunk["filename"] for chunk in content["chunks"] if f"{folder}/{chunk['filename']}" not in listing]
        if missing:
            raise ValueError(f"{options.description}: {where} lists {missing[0]}, which is missing; copy it.")
        heads = files.read_heads({f"{folder}/{chunk['filename']}": 4 * (int(chunk["chunk_size"]) + 2)
                                  for chunk in content["chunks"]})  # the chunk headers, once per node
        for chunk in content["chunks"]:
            name = f"{folder}/{chunk['filename']}"
            count = int(chunk["chunk_size"])
            header = np.frombuffer(heads[name], "<u4").astype(np.int64)
            if len(header) != count + 2 or int(header[0]) != count or header[-1] != listing[name]["size"]:
                raise ValueError(f"{options.description}: {files.url(name)}'s header does not match {where} (or the "
                                 "chunk is truncated); copy the dataset again.")
            chunks.append((index, name, dtype, tokens_loader, header[1:]))
    in_place = [loader and int(at[0]) % np.dtype(dtype).itemsize == 0 for _, _, dtype, loader, at in chunks]
    # items between their sizes are read in place from local files (the node cache holds ids back to back)
    placeable = [here or (not files.remote and not loader and not np.any((at[:-1] + 4) % np.dtype(dtype).itemsize))
                 for here, (_, _, dtype, loader, at) in zip(in_place, chunks)]
    # chunks to decode and a budget: every chunk is read through the node cache
    cached = files.budgeted and not all(placeable)
    return [_chunk_file(files, options, *chunk, in_place=here, cached=cached) for chunk, here in zip(chunks, in_place)]


def _chunk_file(files: CorpusFiles, options: FormatOptions, index: str, name: str, dtype: str, tokens_loader: bool,
                bytes_at: np.ndarray, in_place: bool, cached: bool) -> CorpusFile:
    """One chunk: read in place (a ``TokensLoader`` chunk, or ``PyTreeLoader`` items' ids between
    their sizes, when the ids are aligned), decoded into the node cache (``cached``), or decoded
    once into a kept token file."""
    identity = [files.identity(name), files.identity(index)]
    width = np.dtype(dtype).itemsize
    if tokens_loader:
        offsets = (bytes_at - bytes_at[0]) // width
    else:
        offsets = np.concatenate([[0], np.cumsum(_pytree_counts(bytes_at, dtype))]).astype(np.int64)
    if in_place:
        path = files.url(name) if cached else files.local(name)
        return CorpusFile(files.url(name), dtype, offsets.astype(np.int64), path=path, start=int(bytes_at[0]),
                          identity=identity)
    runs = bytes_at[:-1] + 4  # a PyTreeLoader item's ids, after its leaf size
    if not tokens_loader and not cached and len(runs) and not np.any(runs % width):  # in place, between the sizes
        return CorpusFile(files.url(name), dtype, offsets.astype(np.int64), path=files.local(name), start=int(runs[0]),
                          identity=identity, starts=(runs - runs[0]) // width)
    decode = partial(tokens_loader_tokens if tokens_loader else pytree_tokens, dtype=dtype)
    if cached:
        return CorpusFile(files.url(name), dtype, offsets.astype(np.int64), path=files.url(name), identity=identity,
                          decoder=decode)
    kept_at = kept_folder(options.local_dir, f"litdata-{dtype}-{tokens_loader}", files.identity(name))
    kept_arrays(kept_at, lambda: {"tokens": decode(files.read_bytes(name))})
    path, start = kept_path(kept_at, "tokens")
    return CorpusFile(files.url(name), dtype, offsets.astype(np.int64), path=path, start=start, identity=identity)
