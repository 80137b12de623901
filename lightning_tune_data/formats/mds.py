"""MosaicML MDS datasets (llm-foundry): ``index.json`` + shards, often zstd-compressed.

A shard is ``uint32`` sample count, ``uint32`` byte offsets of the samples (count + 1), the column
config, then the samples; a sample starts with the ``uint32`` sizes of its variable-size columns.
llm-foundry writes one ``tokens`` column (``ndarray:int32`` or ``ndarray:uint16``...; older
datasets ``bytes`` of int64 ids). Each sample is one row: a document, or a fixed-length window
when the dataset was written that way. Samples carry per-sample headers and shards are usually
compressed, so each shard is decoded once per node into one token file (kept, see
:mod:`lightning_tune_data.formats.kept`) and read in place after that.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa

from lightning_tune_data.formats.corpus import CorpusFile
from lightning_tune_data.formats.files import CorpusFiles
from lightning_tune_data.formats.kept import kept_arrays, kept_folder, kept_path
from lightning_tune_data.formats.options import FormatOptions

__all__ = ["is_mds_index", "open_mds"]

_VALUE_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 32: "uint32", 33: "int32", 64: "uint64", 65: "int64"}
_SHAPE_DTYPES = {0: "uint8", 1: "uint16", 2: "uint32", 3: "uint64"}
_TOKEN_COLUMNS = ("tokens", "input_ids")


def is_mds_index(content: object) -> bool:
    """Whether a parsed ``index.json`` is MDS's (``shards`` of format ``mds``)."""
    shards = content.get("shards") if isinstance(content, dict) else None
    return isinstance(shards, list) and all(isinstance(s, dict) and s.get("format") == "mds" for s in shards)


def _column(shard: dict, where: str, options: FormatOptions) -> tuple[int, str]:
    names, encodings = shard["column_names"], shard["column_encodings"]
    wanted = [options.column] if options.column else [name for name in _TOKEN_COLUMNS if name in names]
    if not wanted or wanted[0] not in names:
        raise ValueError(f"{options.description}: {where} has columns {names}; set column to the one holding the ids.")
    at = names.index(wanted[0])
    encoding = encodings[at]
    if not (encoding.startswith("ndarray") or encoding == "bytes"):
        raise ValueError(f"{options.description}: {where}'s column {wanted[0]!r} is {encoding}, not an array of ids.")
    return at, encoding


def _ids(value: memoryview, encoding: str, dtype: str | None) -> np.ndarray:
    """One sample's ids from its column bytes (MDS's ``ndarray`` or ``bytes`` encoding)."""
    if encoding == "bytes":
        return np.frombuffer(value, dtype=dtype or "int64")
    parts = encoding.split(":")
    at, value_dtype = 0, parts[1] if len(parts) > 1 else None
    if value_dtype is None:
        value_dtype, at = _VALUE_DTYPES[value[0]], 1
    if len(parts) < 3:  # the shape is in the sample
        byte = value[at]
        ndim, shape_width = byte >> 2, np.dtype(_SHAPE_DTYPES[byte & 3]).itemsize
        at += 1 + ndim * shape_width
    return np.frombuffer(value[at:], dtype=value_dtype)


def _decode(data: bytes, shard: dict, at: int, encoding: str, options: FormatOptions) -> dict[str, np.ndarray]:
    view = memoryview(data)
    count = int(np.frombuffer(view, "<u4", 1)[0])
    offsets = np.frombuffer(view, "<u4", count + 1, 4).astype(np.int64)
    sizes = shard.get("column_sizes") or [None] * len(shard["column_names"])
    variable = [i for i, size in enumerate(sizes) if size is None]
    pieces = []
    for first, end in zip(offsets[:-1].tolist(), offsets[1:].tolist()):
        heads = np.frombuffer(view, "<u4", len(variable), first).tolist() if variable else []
        lengths = [sizes[i] if sizes[i] is not None else heads[variable.index(i)] for i in range(len(sizes))]
        start = first + 4 * len(variable) + sum(lengths[:at])
        pieces.append(_ids(view[start : start + lengths[at]], encoding, options.dtype))
    dtypes = {piece.dtype.name for piece in pieces}
    if len(dtypes) > 1:
        raise ValueError(f"{options.description}: the samples of a shard hold ids of several dtypes {sorted(dtypes)}.")
    lengths = np.array([len(piece) for piece in pieces], dtype=np.int64)
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, np.int32)
    if tokens.dtype.kind not in "iu":
        raise ValueError(f"{options.description}: the MDS column holds {tokens.dtype} values, not integer token ids.")
    return {"tokens": tokens, "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)}


def open_mds(files: CorpusFiles, names: list[str], options: FormatOptions) -> list[CorpusFile]:
    """The shards of every MDS ``index.json`` among ``names``, in index order.

    Raises:
        ValueError: a shard listed but missing, of another size than recorded, or with no column of ids.
    """
    listing, result = files.listing(), []
    for index in [name for name in names if name.rsplit("/", 1)[-1] == "index.json"]:
        content = json.loads(files.read_many([index])[index])  # fetched once per node
        if not is_mds_index(content):
            continue
        folder, where = index.rsplit("/", 1)[0], files.url(index)
        for shard in content["shards"]:
            at, encoding = _column(shard, where, options)
            stored = shard.get("zip_data") or shard["raw_data"]
            name = f"{folder}/{stored['basename']}"
            if name not in listing or listing[name]["size"] != int(stored["bytes"]):
                raise ValueError(f"{options.description}: {where} lists {stored['basename']} of {stored['bytes']} bytes; "
                                 f"it is {'missing' if name not in listing else 'of another size'}. Copy the dataset again.")

            def decode(name: str = name, shard: dict = shard, at: int = at, encoding: str = encoding) -> dict:
                data = files.read_bytes(name)
                if shard.get("zip_data"):
                    codec = str(shard.get("compression") or "").split(":")[0]
                    if codec != "zstd":
                        raise ValueError(f"{options.description}: {files.url(name)} is {codec}-compressed; only zstd "
                                         "(llm-foundry's choice) or uncompressed shards are read.")
                    data = pa.decompress(data, int(shard["raw_data"]["bytes"]), codec="zstd", asbytes=True)
                return _decode(data, shard, at, encoding, options)

            kept_at = kept_folder(options.local_dir, f"mds-{options.column}-{options.dtype}", files.identity(name))
            kept = kept_arrays(kept_at, decode)
            path, start = kept_path(kept_at, "tokens")
            dtype = kept["tokens"].dtype.name
            result.append(CorpusFile(files.url(name), dtype, np.asarray(kept["offsets"]), path=path, start=start,
                                     identity=[files.identity(name), files.identity(index)]))
    return result
