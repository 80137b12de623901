"""A remote tokenized corpus read by byte ranges through the node's shard cache, under its budget.

A 100 GB ``.bin`` must not need 100 GB of local disk. When a remote corpus is larger than its
share of the node's ``cache_budget``, its token files are never copied whole: each file's
documents are cut into consecutive groups of about :data:`RANGE_BYTES` (a document larger than
that is a range of its own; a small file is one range), and a group's bytes are one unit of the
node's shard cache (:class:`~lightning_tune_data.cache.node_cache.NodeShardCache`): fetched with
one ranged request (``cat_file(path, start, end)``), checked by size, written to a temporary
name and renamed into place, shared by every rank and worker of the node, evicted under the same
budget as the shards of our own stores. A datatrove ``.ds.loss`` range travels in the same unit,
after the ids. Cutting at document boundaries means a document's ids are always in one unit, so
a reader maps them zero-copy, as it maps a shard of a store.

A file whose ids must be decoded (an MDS shard, a LitData chunk of items with size headers: its
:attr:`~lightning_tune_data.formats.corpus.CorpusFile.decoder` is set) is one unit whole: the
fetch reads the file, decodes it and writes its ids back to back, checked against the size
recorded at open; an evicted unit is decoded again when it is needed. Such a corpus is read
through the node cache whenever there is a budget, whatever its size, so no decoded copy is ever
kept outside the budget.

:class:`RangedCorpus` stands where a :class:`~lightning_tune_data.cache.cached_store.CachedStore`
stands: its ranges are the store's shards, so the windowed shuffle, the fetches ahead, the
eviction by next use and exact and elastic resume work unchanged. Before a range is fetched, the
file's size and ETag are checked against those recorded at open: a file that changed under the
run is named in an error, never mixed with the bytes read before.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import xxhash

from lightning_tune_data.cache.cached_store import CachedStore
from lightning_tune_data.cache.window_plan import plan_window
from lightning_tune_data.cache.checksums import CHECKSUM_ALGORITHM
from lightning_tune_data.cache.local_disk import check_shard_cache_disk
from lightning_tune_data.cache.node_cache import NODE_CACHE_FOLDER, NodeShardCache
from lightning_tune_data.cache.root import CacheBudgetError, StoreRoot
from lightning_tune_data.cache.shard_fetch import FetchRetries
from lightning_tune_data.cache.sizes import human_size
from lightning_tune_data.cache.store_files import StoreFiles
from lightning_tune_data.formats.corpus import TokenCorpus
from lightning_tune_data.formats.files import CorpusFiles
from lightning_tune_data.keys import INPUT_IDS, LOSS_MASK
from lightning_tune_data.managers.errors import DataSourceError

__all__ = ["RANGE_BYTES", "RangeFetcher", "RangedCorpus", "cut_ranges", "ranged_corpus"]

#: Bytes of ids per cache unit of a large file (a range ends at the document boundary before it).
RANGE_BYTES = 64 << 20


def cut_ranges(offsets: np.ndarray, width: int, limit: int) -> list[tuple[int, int]]:
    """Consecutive document groups ``(first, end)`` of at most ``limit`` bytes each (a document
    larger than ``limit`` alone).

    Args:
        offsets: cumulative document boundaries in ids (``documents + 1`` values from 0).
        width: bytes per id.
        limit: bytes per group.
    """
    bounds = np.asarray(offsets, dtype=np.int64) * int(width)
    documents, groups, first = len(bounds) - 1, [], 0
    while first < documents:
        end = int(np.searchsorted(bounds, bounds[first] + limit, side="right")) - 1
        end = min(max(end, first + 1), documents)
        groups.append((first, end))
        first = end
    return groups


class RangeFetcher:
    """Writes one range's bytes (ids, then loss mask bytes) to a local file for the node cache.

    Args:
        files: the corpus's files.
        memory: by file number, ids held in memory (documents joined across llm.c files), or the
            decoder of a file read whole and decoded (an MDS shard, a LitData chunk with item headers).
        retries: how failing reads are retried.
    """

    def __init__(self, files: CorpusFiles, memory: dict[int, Any], retries: FetchRetries = FetchRetries()) -> None:
        self.files, self.memory, self.retries = files, memory, retries

    def _check_unchanged(self, url: str, size: int, stamp: str) -> None:
        found = self.files.identity_now(url)
        now = None if found is None else (found["size"], found["stamp"])
        if now != (size, stamp):
            raise DataSourceError(
                f"{self.files.description}: {url} changed while the run read it ({size} bytes, identity {stamp} at open; "
                f"{'missing' if now is None else f'{now[0]} bytes, identity {now[1]}'} now): its documents would move. "
                "Restore the file, or start the data again (resume_data_state: false).")

    def _fs(self) -> Any:
        import fsspec

        return fsspec.core.url_to_fs(self.files.path, **self.files.storage_options)[0]

    def _read(self, url: str, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``url``, retried with backoff, checked by size."""
        failures = 0
        while True:
            try:
                data = self._fs().cat_file(self.files.fs_path(url), start=start, end=end)
                break
            except FileNotFoundError:
                raise DataSourceError(f"{self.files.description}: {url} is missing; it was listed when the corpus was "
                                      "opened. Restore it, or start the data again.") from None
            except Exception as error:  # noqa: BLE001 - s3fs/aiohttp/botocore errors have no common base
                if failures >= self.retries.max_retries:
                    raise DataSourceError(
                        f"{self.files.description}: reading bytes {start}-{end} of {url} failed ({type(error).__name__}: "
                        f"{str(error).strip()[:200]}) after {failures} retries; check the network and the storage."
                    ) from error
                time.sleep(min(self.retries.backoff_s * 2**failures, self.retries.max_backoff_s))
                failures += 1
        if len(data) != end - start:
            raise DataSourceError(f"{self.files.description}: {url} gave {len(data)} bytes for bytes {start}-{end}: "
                                  "it changed while the run read it. Restore it, or start the data again.")
        return data

    def __call__(self, store: Any, relative: str, entry: dict[str, Any], target: Path, retries: FetchRetries,
                 on_bytes: Any) -> None:
        """Write range ``entry``'s bytes to ``target`` (the node cache renames it into place); the
        node cache's arguments ``store``, ``relative`` and ``retries`` are not needed."""
        parts: list[Any] = []
        if "memory" in entry:
            parts.append(self.memory[entry["memory"]][entry["first"] : entry["end"]].tobytes())
        else:
            for url, start, end, size, stamp in entry["reads"]:
                self._check_unchanged(url, size, stamp)
                parts.append(self._read(url, start, end))
        if "decode" in entry:
            try:
                tokens = self.memory[entry["decode"]](parts[0])
            except ValueError as error:
                raise DataSourceError(str(error)) from None
            if tokens.nbytes != entry["size"]:
                raise DataSourceError(
                    f"{self.files.description}: {entry['reads'][0][0]} decodes to {tokens.nbytes} bytes of ids, "
                    f"{entry['size']} when the corpus was opened: it changed. Restore it, or start the data again.")
            parts = [memoryview(np.ascontiguousarray(tokens)).cast("B")]
        with open(target, "wb") as handle:
            for part in parts:
                handle.write(part)
                on_bytes(len(part))
            handle.flush()
            os.fsync(handle.fileno())


class RangedCorpus(CachedStore):
    """A remote :class:`~lightning_tune_data.formats.corpus.TokenCorpus` read range by range
    through the node's shard cache, or a local one whose files are decoded into it (see the
    module's description).

    Args:
        corpus: the corpus, opened from its metadata (its files' paths are URLs).
        files: its files.
        folder: the node's shard cache folder (``<local_cache_dir>/shard-cache``).
        budget: the node's ``cache_budget`` in bytes.
        share: this source's share of it.
        window: ``shuffle_window``, documents a shuffle window mixes (``None``: derived from the share).
        sharers: train sources sharing the budget (for messages).
        range_bytes: bytes of ids per range.
        readers: processes of the node reading the corpus (local ranks times dataloader workers).
    """

    def __init__(self, corpus: TokenCorpus, files: CorpusFiles, folder: Path, budget: int, share: int,
                 window: int | None = None, sharers: int = 1, range_bytes: int = RANGE_BYTES,
                 readers: int = 1) -> None:
        self.corpus = corpus
        self.description = files.description
        self.location = corpus.location
        self.format = corpus.format
        self.columns = [INPUT_IDS, LOSS_MASK] if corpus.has_loss_mask else [INPUT_IDS]
        self.id_check = None  # ranges are checked as they are mapped
        self._vocab = corpus.id_check[0] if corpus.id_check is not None else None
        self.shards, memory = self._ranges(corpus, int(range_bytes))
        self.shard_rows = np.array([entry["rows"] for entry in self.shards], dtype=np.int64)
        self.shard_starts = np.concatenate([[0], np.cumsum(self.shard_rows)]).astype(np.int64)
        self.budget, self.share = int(budget), int(share)
        largest = max(max(1, entry["size"]) for entry in self.shards)
        if 2 * largest > self.share:
            unit = "decoded shards" if any("decode" in entry for entry in self.shards) else "byte ranges"
            raise ValueError(
                f"{self.description}: cache_budget {human_size(self.budget)} ({human_size(self.share)} for this source) "
                f"cannot hold two {unit} of its files (the one being read and the next, fetched ahead: up to "
                f"{human_size(largest)} each). Raise cache_budget to at least "
                f"{human_size(2 * largest * max(1, sharers))}.")
        self.sharers = int(sharers)
        self.order = plan_window(self.shard_rows.tolist(), [max(1, entry["size"]) for entry in self.shards],
                                 corpus.num_tokens, self.share, window, int(range_bytes), self.description, self.sharers,
                                 readers)
        name = re.sub(r"[^A-Za-z0-9._-]+", "-", files.path.rstrip("/").rsplit("/", 1)[-1]).strip("-.") or "corpus"
        if files.remote:
            protocol, rest = files.path.split("://", 1)
            bucket = f"{protocol}://{rest.split('/', 1)[0]}"  # the root is named only (the fetcher reads the files)
        else:  # a local corpus whose shards are decoded into the node cache
            bucket = os.path.dirname(os.path.abspath(files.path.rstrip("/"))) or "/"
        store_files = StoreFiles(StoreRoot(bucket, files.storage_options, files.local_dir), name)
        self.cache = NodeShardCache(store_files, Path(folder), self.shards, self.budget, description=self.description)
        self.cache.fetch = RangeFetcher(files, memory)
        self._start_here()

    @staticmethod
    def _ranges(corpus: TokenCorpus, range_bytes: int) -> tuple[list[dict[str, Any]], dict[int, np.ndarray]]:
        """Every range's entry (what the node cache names, sizes and fetches), in document order."""
        shards, memory = [], {}
        for number, entry in enumerate(corpus.files):
            width = np.dtype(entry.dtype).itemsize
            identity = {item["url"]: item for item in entry.identity}
            if entry.tokens is not None:
                memory[number] = entry.tokens
            if entry.decoder is not None:  # decoded whole: one unit per file (a shard of MDS, a chunk of LitData)
                size = int(identity[entry.path]["size"])
                key = xxhash.xxh3_64(repr((entry.name, size, identity[entry.path]["stamp"], entry.dtype,
                                           "decoded")).encode()).hexdigest()
                shards.append({"file": number, "documents": (0, entry.documents), "rows": entry.documents,
                               "size": entry.num_tokens * width, "decode": number,
                               "reads": [(entry.path, 0, size, size, str(identity[entry.path]["stamp"]))],
                               "path": f"ranges/{number:06d}/decoded.ids", CHECKSUM_ALGORITHM: key})
                memory[number] = entry.decoder
                continue
            for part, (first, end) in enumerate(cut_ranges(entry.offsets, width, range_bytes)):
                lo, hi = int(entry.offsets[first]), int(entry.offsets[end])
                item: dict[str, Any] = {"file": number, "documents": (first, end), "rows": end - first,
                                        "size": (hi - lo) * (width + (entry.loss_path is not None))}
                if entry.tokens is not None:
                    item.update(memory=number, first=lo, end=hi)
                else:
                    reads = [(entry.path, entry.start + lo * width, entry.start + hi * width)]
                    if entry.loss_path is not None:
                        reads.append((entry.loss_path, entry.loss_start + lo, entry.loss_start + hi))
                    item["reads"] = [(url, a, b, int(identity[url]["size"]), str(identity[url]["stamp"]))
                                     for url, a, b in reads]
                key = xxhash.xxh3_64(repr((entry.name, item.get("reads"), lo, hi, entry.dtype)).encode()).hexdigest()
                item.update(path=f"ranges/{number:06d}/{part:06d}.ids", **{CHECKSUM_ALGORITHM: key})
                shards.append(item)
        return shards, memory

    # -- what the corpus source asks of a corpus -------------------------------------------------------------
    def identity(self) -> list[dict[str, Any]]:
        """Every file's ``{"url", "size", "stamp"}`` as recorded at open."""
        return self.corpus.identity()

    @property
    def num_tokens(self) -> int:
        """Tokens of all documents."""
        return self.corpus.num_tokens

    def check_ids(self, rows: np.ndarray) -> None:
        """Nothing to do: a range's ids are checked when it is mapped.

        Args:
            rows: unused.
        """

    # -- mapping a range ----------------------------------------------------------------------------------------
    def _open(self, shard: int, pin: bool) -> tuple[pa.Table, dict[str, Any]]:
        mapped = self._mapped.get(shard)
        if mapped is None:
            entry = self.shards[shard]
            data = pa.py_buffer(self.cache.map(shard)) if entry["size"] else pa.py_buffer(b"")
            mapped = self._mapped[shard] = (self._table(entry, data), {})
        if pin:
            self._pinned.add(shard)
        else:
            self._let_go(shard)
        return mapped

    def _table(self, entry: dict[str, Any], data: pa.Buffer) -> pa.Table:
        """The range's documents as a table of zero-copy views over its mapped bytes."""
        source = self.corpus.files[entry["file"]]
        first, end = entry["documents"]
        offsets = (source.offsets[first : end + 1] - source.offsets[first]).astype(np.int64)
        count, dtype = int(offsets[-1]), np.dtype(source.dtype)
        ids = data.slice(0, count * dtype.itemsize)
        if self._vocab is not None and count:
            values = np.frombuffer(ids, dtype=dtype)
            if int(values.max()) >= self._vocab:
                at = int(np.argmax(values >= self._vocab))
                raise ValueError(
                    f"{source.name} holds id {int(values[at])} at token {int(source.offsets[first]) + at}, beyond the "
                    f"tokenizer's vocabulary of {self._vocab}; use the tokenizer that wrote the corpus.")
        columns = {INPUT_IDS: _list_array(ids, pa.from_numpy_dtype(dtype), count, offsets)}
        if LOSS_MASK in self.columns:
            columns[LOSS_MASK] = _list_array(data.slice(count * dtype.itemsize, count), pa.uint8(), count, offsets)
        return pa.table(columns)

    def __repr__(self) -> str:
        return (f"RangedCorpus({self.format}: {self.location}, {len(self):,} documents in {self.num_shards} ranges, "
                f"window={self.window})")


def _list_array(buffer: pa.Buffer, kind: pa.DataType, count: int, offsets: np.ndarray) -> pa.Array:
    values = pa.Array.from_buffers(kind, count, [None, buffer])
    return pa.LargeListArray.from_arrays(pa.array(offsets), values)


def ranged_corpus(corpus: TokenCorpus, files: CorpusFiles, root: StoreRoot) -> RangedCorpus:
    """``corpus`` read by ranges under ``root``'s ``cache_budget`` (see :class:`RangedCorpus`).

    Raises:
        CacheBudgetError: the budget cannot hold a shuffle window and the next one, or
            ``local_cache_dir`` is on a network filesystem or a disk without room for the budget.
    """
    try:
        ranged = RangedCorpus(corpus, files, root.local_dir / NODE_CACHE_FOLDER, int(root.cache_budget),
                              int(root.budget_share), root.shuffle_window, root.budget_sharers, RANGE_BYTES,
                              root.node_readers)
        check_shard_cache_disk(ranged.cache.node_folder, ranged.budget, ranged.cache.node_usage(), files.description)
    except ValueError as error:
        raise CacheBudgetError(str(error)) from None
    return ranged
