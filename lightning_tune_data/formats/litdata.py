"""LitData optimized datasets (``litdata.optimize``, litgpt recipes): ``index.json`` + ``chunk-*.bin``.

A chunk is ``uint32`` item count, ``uint32`` byte offsets of its items (count + 1), then the items.
With litgpt's ``TokensLoader`` each item is one document's raw ids, back to back: the chunk is read
in place, the offsets being the document boundaries (unless the header leaves the ids unaligned,
e.g. int64 ids after an odd number of header words: then it is copied out once, like the next case). With the default ``PyTreeLoader`` an item of
one 1-D array is a ``uint32`` size then the ids; such a chunk is decoded once per node into one
token file (kept, see :mod:`lightning_tune_data.formats.kept`). Only the index and the chunk
headers are read to open a ``TokensLoader`` dataset. Compressed or encrypted chunks are refused.
"""

from __future__ import annotations

import json

import numpy as np

from lightning_tune_data.formats.corpus import CorpusFile
from lightning_tune_data.formats.files import CorpusFiles
from lightning_tune_data.formats.kept import kept_arrays, kept_folder, kept_path
from lightning_tune_data.formats.options import FormatOptions

__all__ = ["is_litdata_index", "open_litdata"]

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


def _decode_pytree(data: bytes, dtype: str) -> dict[str, np.ndarray]:
    count = int(np.frombuffer(data, "<u4", 1)[0])
    offsets = np.frombuffer(data, "<u4", count + 1, 4).astype(np.int64)
    pieces = [np.frombuffer(data, dtype, (int(b) - int(a) - 4) // np.dtype(dtype).itemsize, int(a) + 4)
              for a, b in zip(offsets[:-1], offsets[1:])]
    lengths = np.array([len(piece) for piece in pieces], dtype=np.int64)
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype)
    return {"tokens": tokens, "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)}


def _decode_tokens(data: bytes, dtype: str) -> dict[str, np.ndarray]:
    """A ``TokensLoader`` chunk whose ids are not aligned in the file (a header of an odd number of
    words before 8-byte ids), copied out into one aligned token array."""
    count = int(np.frombuffer(data, "<u4", 1)[0])
    offsets = np.frombuffer(data, "<u4", count + 1, 4).astype(np.int64)
    tokens = np.frombuffer(data[int(offsets[0]) : int(offsets[-1])], dtype=dtype).copy()
    return {"tokens": tokens, "offsets": (offsets - offsets[0]) // np.dtype(dtype).itemsize}


def open_litdata(files: CorpusFiles, names: list[str], options: FormatOptions) -> list[CorpusFile]:
    """The chunks of every LitData ``index.json`` among ``names``, in index order.

    Raises:
        ValueError: compressed or encrypted chunks, items that are not one integer array, a chunk
            listed but missing, or a chunk whose header does not match the index.
    """
    listing, result = files.listing(), []
    for index in [name for name in names if name.rsplit("/", 1)[-1] == "index.json"]:
        content = json.loads(files.read_many([index])[index])  # fetched once per node
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
            identity = [files.identity(name), files.identity(index)]
            width = np.dtype(dtype).itemsize
            if tokens_loader and int(header[1]) % width == 0:  # ids aligned in the file: read in place
                bytes_at = header[1:]
                offsets = (bytes_at - bytes_at[0]) // width
                result.append(CorpusFile(files.url(name), dtype, offsets.astype(np.int64), path=files.local(name),
                                         start=int(bytes_at[0]), identity=identity))
                continue
            kept_at = kept_folder(options.local_dir, f"litdata-{dtype}-{tokens_loader}", files.identity(name))
            decode = _decode_tokens if tokens_loader else _decode_pytree
            kept = kept_arrays(kept_at, lambda name=name, decode=decode: decode(files.read_bytes(name), dtype))
            path, start = kept_path(kept_at, "tokens")
            result.append(CorpusFile(files.url(name), dtype, np.asarray(kept["offsets"]), path=path, start=start,
                                     identity=identity))
    return result
