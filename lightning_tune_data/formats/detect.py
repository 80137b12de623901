"""Which format a corpus's files are in (``format: auto``), from their names, headers and ``index.json``.

Each file is classified on its own: our committed store (its ``_COMPLETE.json``), an
``index.json`` (MDS's lists ``shards`` of format ``mds``; LitData's ``chunks`` and ``config``), a
Megatron ``.idx`` (a ``.bin`` is Megatron's when any ``.idx`` is present), datatrove's ``.ds``
files, Dolma's header-less ``.npy``, MDS shards, LitData's ``chunk-*.bin`` beside its index, and
otherwise a ``.bin`` is llm.c's when it starts with llm.c's magic number, else nanoGPT's raw ids.
One format must account for every file (notes such as ``README.md`` are ignored); an unknown or
mixed layout fails, naming what was found.
"""

from __future__ import annotations

import json

from lightning_tune_data.formats.files import CorpusFiles
from lightning_tune_data.formats.litdata import is_litdata_index
from lightning_tune_data.formats.mds import is_mds_index
from lightning_tune_data.formats.nanogpt import llmc_header

__all__ = ["STORE_MARKER", "detect_format", "format_files"]

#: The file that makes a folder one of our committed stores.
STORE_MARKER = "_COMPLETE.json"
_IGNORED = (".md", ".txt", ".gitattributes", ".gitignore", ".lock")
_DATATROVE = (".ds", ".ds.index", ".ds.metadata", ".ds.loss")


def _base(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def _kind(name: str, heads: dict[str, bytes], has_idx: bool, indexes: dict[str, str]) -> str | None:
    base, folder = _base(name), name.rsplit("/", 1)[0]
    if base == "index.json":
        return indexes.get(name, "unknown")
    if name.endswith(".idx"):
        return "megatron"
    if name.endswith(_DATATROVE):
        return "datatrove"
    if name.endswith((".npy", ".csv.gz")):
        return "dolma"
    if name.endswith((".mds", ".mds.zstd")):
        return "mds"
    if name.endswith(".bin"):
        if base.startswith("chunk-") and indexes.get(f"{folder}/index.json") == "litdata":
            return "litdata"
        if has_idx:
            return "megatron"
        return "llmc" if llmc_header(heads[name]) is not None else "nanogpt"
    return None


def format_files(files: CorpusFiles) -> dict[str, list[str]]:
    """The listed files by the format each belongs to (``"unknown"``: none); notes are left out."""
    listing = [name for name in files.listing() if not _base(name).startswith(".") and not name.endswith(_IGNORED)]
    if any(_base(name) == STORE_MARKER for name in listing):
        return {"lightning_tune_data": listing}
    indexes = {}
    fetched = files.read_many([name for name in listing if _base(name) == "index.json"])  # once per node
    for name in listing:
        if _base(name) == "index.json":
            try:
                content = json.loads(fetched[name])
            except ValueError:
                content = None
            indexes[name] = "mds" if is_mds_index(content) else "litdata" if is_litdata_index(content) else "unknown"
    has_idx = any(name.endswith(".idx") for name in listing)
    raw = [] if has_idx else [name for name in listing if name.endswith(".bin") and not (
        _base(name).startswith("chunk-") and indexes.get(name.rsplit("/", 1)[0] + "/index.json") == "litdata")]
    heads = files.read_heads({name: 12 for name in raw})  # llm.c's magic number, or raw ids (once per node)
    found: dict[str, list[str]] = {}
    for name in listing:
        found.setdefault(_kind(name, heads, has_idx, indexes) or "unknown", []).append(name)
    return found


def detect_format(files: CorpusFiles, description: str, found: dict[str, list[str]] | None = None) -> str:
    """The one format of the corpus's files (``found``: :func:`format_files`' result, when known).

    Raises:
        ValueError: files of no known format, or of several, naming what was found.
    """
    found = format_files(files) if found is None else found
    if len(found) == 1 and "unknown" not in found:
        return next(iter(found))
    summary = ", ".join(f"{len(names)} {kind} file(s) (e.g. {files.url(names[0])})" for kind, names in found.items())
    if set(found) == {"unknown"} or len(found) == 1:
        raise ValueError(f"{description}: no known tokenized format among the files at {files.path}: {summary}. Point "
                         "path at Megatron .bin/.idx, datatrove .ds, Dolma .npy, nanoGPT/llm.c .bin, LitData or MDS "
                         "index.json folders, or a store prepare wrote; or set format.")
    raise ValueError(f"{description}: the files at {files.path} mix formats: {summary}. Point path at one format's "
                     "files (a folder or glob of them), or set format to read only its files.")

