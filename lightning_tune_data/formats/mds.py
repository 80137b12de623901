"""MosaicML MDS datasets (llm-foundry): ``index.json`` + shards, often zstd-compressed.

A shard is ``uint32`` sample count, ``uint32`` byte offsets of the samples (count + 1), the column
config, then the samples; a sample starts with the ``uint32`` sizes of its variable-size columns.
llm-foundry writes one ``tokens`` column (``ndarray:int32`` or ``ndarray:uint16``...; older
datasets ``bytes`` of int64 ids). Each sample is one row: a document, or a fixed-length window
when the dataset was written that way.

A sample's ids are one run of the shard's bytes, after its headers (sizes, an ndarray's 2 to 5
shape bytes). Where every run of an uncompressed local shard is aligned to the id width, the
shard is read in place (list views over the file; only each sample's position is kept).
Otherwise (compressed shards, or runs left unaligned by the headers: the usual ``int32`` case)
the ids are copied out with NumPy, every sample at once (:mod:`lightning_tune_data.formats.runs`):
with a ``cache_budget`` (remote or local), shard by shard into the node's shard cache when a
shard is fetched (:class:`MdsShardDecoder`, only the boundaries kept at open); without one, once
per node into one kept token file per shard (:mod:`lightning_tune_data.formats.kept`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from lightning_tune_data.formats.corpus import CorpusFile
from lightning_tune_data.formats.files import CorpusFiles
from lightning_tune_data.formats.kept import kept_arrays, kept_folder, kept_path
from lightning_tune_data.formats.options import FormatOptions
from lightning_tune_data.formats.runs import gather_runs, read_u32_at

__all__ = ["MdsShardDecoder", "is_mds_index", "open_mds"]

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


def _value_runs(raw: np.ndarray, starts: np.ndarray, sizes: np.ndarray, encoding: str,
                dtype: str | None) -> tuple[np.ndarray, np.ndarray, str]:
    """Where each sample's ids are: ``(first byte, bytes, dtype)`` from its column's bytes (MDS's
    ``ndarray`` encodings: an optional dtype byte, an optional shape, then the values; or ``bytes``)."""
    if encoding == "bytes":
        return starts, sizes, dtype or "int64"
    parts = encoding.split(":")
    value_dtype, at = (parts[1] if len(parts) > 1 else None), np.zeros(len(starts), np.int64)
    if value_dtype is None:  # the dtype is in each sample
        codes = np.unique(raw[starts]).tolist() if len(starts) else []
        if len(codes) > 1 or any(code not in _VALUE_DTYPES for code in codes):
            raise ValueError(f"samples hold ids of several or unknown dtypes (codes {codes})")
        value_dtype, at = (_VALUE_DTYPES[codes[0]] if codes else "int32"), at + 1
    if len(parts) < 3:  # the shape is in each sample: one byte (dimensions, shape width), then the shape
        byte = raw[starts + at].astype(np.int64)
        shape_width = np.array([np.dtype(_SHAPE_DTYPES[k]).itemsize for k in range(4)], np.int64)[byte & 3]
        at = at + 1 + (byte >> 2) * shape_width
    return starts + at, sizes - at, value_dtype


def _runs(raw: np.ndarray, shard: dict, at: int, encoding: str, options: FormatOptions) -> tuple[np.ndarray, np.ndarray, str]:
    """Where a shard's samples hold their ids: ``(first byte, id count, dtype)``, every sample at once."""
    count = int(read_u32_at(raw, np.zeros(1, np.int64))[0])
    samples = read_u32_at(raw, 4 + 4 * np.arange(count + 1, dtype=np.int64))[:-1]
    fixed = shard.get("column_sizes") or [None] * len(shard["column_names"])
    variable = [i for i, size in enumerate(fixed) if size is None]
    heads = {i: read_u32_at(raw, samples + 4 * j) for j, i in enumerate(variable)}
    lengths = [heads[i] if fixed[i] is None else np.full(count, int(fixed[i]), np.int64) for i in range(len(fixed))]
    column = samples + 4 * len(variable) + sum((lengths[i] for i in range(at)), np.zeros(count, np.int64))
    if count and (int(column.min()) < 0 or int((column + lengths[at]).max()) > len(raw)):
        raise ValueError(f"a sample reaches beyond the shard's {len(raw)} bytes (truncated, or not an MDS shard)")
    starts, value_bytes, dtype = _value_runs(raw, column, lengths[at], encoding, options.dtype)
    if np.dtype(dtype).kind not in "iu":
        raise ValueError(f"the MDS column holds {dtype} values, not integer token ids.")
    if np.any(value_bytes < 0):
        raise ValueError("a sample's array header is longer than the sample (not an MDS shard of this encoding)")
    if np.any(value_bytes % np.dtype(dtype).itemsize):
        raise ValueError(f"a sample's ids are not a whole number of {dtype} values (set the dtype option)")
    return starts, value_bytes // np.dtype(dtype).itemsize, dtype


@dataclass(frozen=True)
class MdsShardDecoder:
    """Turns one shard's stored bytes (zstd-compressed or not) into its token ids; picklable, so a
    node-cache fetch in any process can decode the shard again.

    Args:
        shard: the shard's entry in ``index.json``.
        column: the position of the ids' column.
        encoding: that column's MDS encoding.
        options: the source's format options.
        url: the shard's URL (for messages).
    """

    shard: dict
    column: int
    encoding: str
    options: FormatOptions
    url: str

    def runs(self, data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
        """The shard's bytes (decompressed) and where its samples hold their ids: ``(bytes, first
        byte, id count, dtype)`` per sample.

        Raises:
            ValueError: a codec other than zstd, or bytes that do not hold the samples the headers say.
        """
        if self.shard.get("zip_data"):
            codec = str(self.shard.get("compression") or "").split(":")[0]
            if codec != "zstd":
                raise ValueError(f"{self.options.description}: {self.url} is {codec}-compressed; only zstd "
                                 "(llm-foundry's choice) or uncompressed shards are read.")
            data = pa.decompress(data, int(self.shard["raw_data"]["bytes"]), codec="zstd", asbytes=True)
        raw = np.frombuffer(data, np.uint8)
        try:
            return (raw, *_runs(raw, self.shard, self.column, self.encoding, self.options))
        except ValueError as error:
            raise ValueError(f"{self.options.description}: {self.url}: {error}; write the dataset again with "
                             "MDSWriter.") from None

    def __call__(self, data: bytes) -> np.ndarray:
        """The shard's ids, from its stored bytes."""
        raw, starts, counts, dtype = self.runs(data)
        try:
            return gather_runs(raw, starts, counts, dtype)
        except ValueError as error:
            raise ValueError(f"{self.options.description}: {self.url}: {error}; write the dataset again.") from None


def _boundaries(decoder: MdsShardDecoder, data: bytes, local: bool, with_ids: bool) -> dict[str, np.ndarray]:
    """What is kept of a shard at open: its samples' boundaries and dtype; for a local uncompressed
    shard whose ids all lie aligned, where they are (``starts``, in ids); else, ``with_ids``, the
    ids copied out (``tokens``: no node cache will hold them), from the same read."""
    raw, starts, counts, dtype = decoder.runs(data)
    kept = {"offsets": np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), "dtype": np.array([dtype])}
    if local and not decoder.shard.get("zip_data") and not np.any(starts % np.dtype(dtype).itemsize):
        kept["starts"] = starts // np.dtype(dtype).itemsize
    elif with_ids:
        kept["tokens"] = gather_runs(raw, starts, counts, dtype)
    return kept


def _mapped(path: str) -> np.ndarray:
    """A local shard's bytes, memory-mapped (finding where its ids are reads the pages of its headers)."""
    return np.memmap(path, dtype=np.uint8, mode="r")


def open_mds(files: CorpusFiles, names: list[str], options: FormatOptions) -> list[CorpusFile]:
    """The shards of every MDS ``index.json`` among ``names``, in index order.

    Raises:
        ValueError: a shard listed but missing, of another size than recorded, or with no column of ids.
    """
    listing, shards = files.listing(), []
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
            decoder = MdsShardDecoder(shard, at, encoding, options, files.url(name))
            identity = [files.identity(name), files.identity(index)]
            kept_at = kept_folder(options.local_dir, f"mds-bounds-{options.column}-{options.dtype}", identity[0])
            read = _mapped if not files.remote else files.read_bytes
            kept = kept_arrays(kept_at, lambda name=name, decoder=decoder, read=read: _boundaries(
                decoder, read(name), not files.remote, not files.budgeted))
            shards.append((name, decoder, identity, kept))
    # with a budget, shards that cannot be read in place are decoded into the node cache (then all are)
    cached = files.budgeted and not all("starts" in kept for *_, kept in shards)
    return [_shard_file(files, options, *shard, cached=cached) for shard in shards]


def _shard_file(files: CorpusFiles, options: FormatOptions, name: str, decoder: MdsShardDecoder,
                identity: list[dict], kept: dict[str, np.ndarray], cached: bool) -> CorpusFile:
    """One shard: read in place (its ids all aligned), decoded into the node cache (``cached``), or
    decoded once into a kept token file."""
    dtype, offsets = str(kept["dtype"][0]), np.asarray(kept["offsets"])
    if cached:
        return CorpusFile(files.url(name), dtype, offsets, path=files.url(name), identity=identity, decoder=decoder)
    if "starts" in kept:  # read in place, between the headers
        return CorpusFile(files.url(name), dtype, offsets, path=name, identity=identity, starts=np.asarray(kept["starts"]))
    kept_at = kept_folder(options.local_dir, f"mds-bounds-{options.column}-{options.dtype}", identity[0])
    if "tokens" not in kept:  # the boundaries were kept by a run with a budget: the ids apart
        kept_at = kept_folder(options.local_dir, f"mds-ids-{options.column}-{options.dtype}", identity[0])
        read = _mapped if not files.remote else files.read_bytes
        kept_arrays(kept_at, lambda: {"tokens": decoder(read(name))})
    path, start = kept_path(kept_at, "tokens")
    return CorpusFile(files.url(name), dtype, offsets, path=path, start=start, identity=identity)
