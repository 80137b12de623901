"""A tokenized corpus in another tool's format, described once and read in place.

Every format reader (:mod:`lightning_tune_data.formats`) turns its files into the same small
description: per file, where its token ids are (a local file and a byte offset, or a few tokens
held in memory), their dtype, and the document boundaries as cumulative token offsets (plus, when
the format has one, a per-token loss mask file). Opening reads metadata only; the tokens are
memory-mapped in the process that reads them.

A :class:`TokenCorpus` stands where a memory-mapped ``datasets.Dataset`` stands for one of our
own stores: its :attr:`~TokenCorpus.data` is an Arrow table whose ``input_ids`` column has one
chunk per file, each a zero-copy ``large_list`` view over that file's mapping. The train source
(``ArrowSource``), the length checks and the packers' flat token view read it exactly as they
read a store: computed keyed order per pass, exact and elastic resume, every packing strategy.
The corpus pickles as its description (no mappings), so it travels into dataloader workers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from lightning_tune_data.formats.files import stat_identity
from lightning_tune_data.formats.runs import gather_runs
from lightning_tune_data.keys import INPUT_IDS, LOSS_MASK

__all__ = ["CorpusFile", "CorpusTable", "TokenCorpus"]


@dataclass
class CorpusFile:
    """One file's documents: token ids, their dtype and the document boundaries.

    Args:
        name: the file as the user named it (URL or path), for messages.
        dtype: the token ids' NumPy dtype name.
        offsets: cumulative document boundaries in tokens from the first token (``documents + 1``
            int64 values, starting at 0).
        path: the local file holding the token ids (``None`` when ``tokens`` holds them).
        start: byte offset of the first token in ``path``.
        tokens: token ids held in memory (documents joined across files), instead of ``path``.
        loss_path: a local file of one byte per token (non-zero: the token is a training target),
            read from byte ``loss_start``.
        loss_start: byte offset of the first token's mask byte in ``loss_path``.
        identity: ``{"url", "size", "stamp"}`` of the files read (recorded at first open).
        starts: for documents that lie apart in the file (between per-item headers): each
            document's first id, counted in ids from byte ``start`` (``None``: back to back).
        decoder: for a file whose ids are not stored as one run (compressed MDS shards, items with
            size headers) and that is read through the node cache: turns the file's bytes (``path``
            is its URL) into its ids, when the cache fetches it (picklable).
    """

    name: str
    dtype: str
    offsets: np.ndarray
    path: str | None = None
    start: int = 0
    tokens: np.ndarray | None = None
    loss_path: str | None = None
    loss_start: int = 0
    identity: list[dict[str, Any]] = field(default_factory=list)
    decoder: Callable[[bytes], np.ndarray] | None = None
    starts: np.ndarray | None = None

    @property
    def documents(self) -> int:
        """Documents of the file."""
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> int:
        """Tokens of the file's documents."""
        return int(self.offsets[-1]) if len(self.offsets) else 0

    def check_unchanged(self) -> None:
        """Fail when a local file's size or modification time is not what was recorded at open.

        Raises:
            ValueError: naming the file (its documents would have moved).
        """
        for item in self.identity:
            if "://" in item["url"]:
                continue  # a remote file is read from the copy made for the identity it had at open
            try:
                now = stat_identity(os.stat(item["url"]))
            except OSError:
                now = None
            if now != {"size": item["size"], "stamp": item["stamp"]}:
                raise ValueError(
                    f"{item['url']} changed since the corpus was opened ({item['size']} bytes then, "
                    f"{'missing' if now is None else str(now['size']) + ' bytes'} now): its documents would move. "
                    "Restore the file, or start the data again (resume_data_state: false)."
                )

    @property
    def span(self) -> int:
        """Ids from ``start`` to the end of the last document (more than :attr:`num_tokens` when
        the documents lie apart)."""
        if self.starts is None or not len(self.starts):
            return self.num_tokens
        return int(self.starts[-1]) + int(self.offsets[-1] - self.offsets[-2])

    def token_array(self) -> np.ndarray:
        """The file's token ids (memory-mapped, or the ones held in memory); for documents that
        lie apart, every id from the first document's to the last one's end, headers between included."""
        if self.tokens is not None:
            return self.tokens
        if self.span == 0:
            return np.zeros(0, dtype=self.dtype)
        return np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.start, shape=(self.span,))

    def document_ids(self) -> np.ndarray:
        """The ids of the file's documents only, joined (a copy when they lie apart)."""
        tokens = self.token_array()
        if self.starts is None:
            return tokens
        width = np.dtype(self.dtype).itemsize
        return gather_runs(tokens.view(np.uint8), self.starts * width, np.diff(self.offsets), self.dtype)

    def loss_array(self) -> np.ndarray | None:
        """The file's loss mask bytes (memory-mapped), or ``None`` when it has none."""
        if self.loss_path is None:
            return None
        if self.num_tokens == 0:
            return np.zeros(0, dtype=np.uint8)
        return np.memmap(self.loss_path, dtype=np.uint8, mode="r", offset=self.loss_start, shape=(self.num_tokens,))


def _list_chunk(values: np.ndarray, offsets: np.ndarray, starts: np.ndarray | None, view: bool) -> pa.Array:
    """An array over ``values`` (zero-copy) with rows cut at ``offsets``: a ``large_list``, or with
    ``view`` a ``large_list_view`` (rows at ``starts`` when given, apart in the values)."""
    arrow_values = pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), len(values), [None, pa.py_buffer(values)])
    offsets = np.asarray(offsets, dtype=np.int64)
    if not view:
        return pa.LargeListArray.from_arrays(pa.array(offsets), arrow_values)
    firsts = offsets[:-1] if starts is None else np.asarray(starts, dtype=np.int64)
    return pa.LargeListViewArray.from_arrays(pa.array(firsts), pa.array(np.diff(offsets)), arrow_values)


class CorpusTable:
    """What ``datasets.Dataset.data`` is for a cached dataset: an object holding the Arrow ``table``.

    Args:
        table: the corpus's table.
    """

    def __init__(self, table: pa.Table) -> None:
        self.table = table


class TokenCorpus:
    """Every file of a tokenized corpus, read in place as one table of documents.

    Args:
        files: the corpus's files in document order.
        format: the format's name (for messages).
        location: where the corpus is (the path or URL given), for messages.
    """

    def __init__(self, files: list[CorpusFile], format: str, location: str) -> None:
        self.files = [entry for entry in files if entry.documents > 0]
        self.format = format
        self.location = location
        self.dtype = self.files[0].dtype if self.files else "uint16"
        self._table: pa.Table | None = None
        self._row_starts = np.concatenate([[0], np.cumsum([entry.documents for entry in self.files])]).astype(np.int64)
        #: ``(vocabulary size, this node's folder)`` when ids must be checked as files are read.
        self.id_check: tuple[int, str] | None = None
        self._checked: set[int] = set()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_table"] = None  # mappings are made again in the process that reads
        state["_checked"] = set()
        return state

    def __len__(self) -> int:
        return int(sum(entry.documents for entry in self.files))

    @property
    def num_tokens(self) -> int:
        """Tokens of all documents."""
        return int(sum(entry.num_tokens for entry in self.files))

    @property
    def has_loss_mask(self) -> bool:
        """Whether the corpus has a per-token loss mask."""
        return bool(self.files) and self.files[0].loss_path is not None

    def identity(self) -> list[dict[str, Any]]:
        """Every file's ``{"url", "size", "stamp"}`` as recorded at open (in file order)."""
        return [item for entry in self.files for item in entry.identity]

    def table(self) -> pa.Table:
        """The corpus as an Arrow table (``input_ids`` [+ ``loss_mask``]), one chunk per file
        (built once per process; the chunks are views over the files' mappings)."""
        if self._table is None:
            for entry in self.files:
                entry.check_unchanged()
            view = any(entry.starts is not None for entry in self.files)  # documents apart: list views
            columns = {INPUT_IDS: [_list_chunk(entry.token_array(), entry.offsets, entry.starts, view)
                                   for entry in self.files]}
            if self.has_loss_mask:
                columns[LOSS_MASK] = [_list_chunk(entry.loss_array(), entry.offsets, entry.starts, view)
                                      for entry in self.files]
            listed = pa.large_list_view if view else pa.large_list
            kind = {INPUT_IDS: listed(pa.from_numpy_dtype(np.dtype(self.dtype))), LOSS_MASK: listed(pa.uint8())}
            self._table = pa.table({name: pa.chunked_array(chunks, type=kind[name]) for name, chunks in columns.items()})
        return self._table

    def check_ids(self, rows: np.ndarray) -> None:
        """Check that the files of ``rows`` hold only ids below the vocabulary, the first time one
        of their rows is read in this process (with :attr:`id_check`; a file's largest id is
        worked out once per node and kept).

        Raises:
            ValueError: naming the file, the position and the id.
        """
        if self.id_check is None or len(self._checked) == len(self.files):
            return
        from lightning_tune_data.formats.kept import kept_arrays, kept_folder

        vocab, local_dir = self.id_check
        for at in np.unique(np.searchsorted(self._row_starts, np.asarray(rows), side="right") - 1).tolist():
            if at in self._checked:
                continue
            entry = self.files[at]
            tokens = entry.document_ids()
            identity = entry.identity[0] if entry.identity else {"url": entry.name, "size": 0, "stamp": ""}
            kept = kept_arrays(kept_folder(local_dir, "largest", identity),
                               lambda: {"largest": np.array([int(tokens.max()) if len(tokens) else -1])})
            if int(kept["largest"][0]) >= vocab:
                position = int(np.argmax(np.asarray(tokens) >= vocab))
                raise ValueError(
                    f"{entry.name} holds id {int(tokens[position])} at token {position} (largest "
                    f"{int(kept['largest'][0])}), beyond the tokenizer's vocabulary of {vocab}; use the tokenizer that "
                    "wrote the corpus."
                )
            self._checked.add(at)

    @property
    def data(self) -> CorpusTable:
        """The table, where a ``datasets.Dataset`` has it (``dataset.data.table``)."""
        return CorpusTable(self.table())

    @property
    def column_names(self) -> list[str]:
        """The table's columns."""
        return [INPUT_IDS, LOSS_MASK] if self.has_loss_mask else [INPUT_IDS]

    def __getitem__(self, row: int) -> dict[str, Any]:
        """Document ``row`` as ``{"input_ids": [...]}`` (``loss_mask`` too when the corpus has one),
        for previews and evaluation loaders."""
        table = self.table()
        sample = {INPUT_IDS: table.column(INPUT_IDS)[int(row)].values.to_numpy().tolist()}
        if self.has_loss_mask:
            sample[LOSS_MASK] = [bool(x) for x in table.column(LOSS_MASK)[int(row)].values.to_numpy()]
        return sample

    def __repr__(self) -> str:
        return (f"TokenCorpus({self.format}: {self.location}, {len(self):,} documents, {self.num_tokens:,} tokens "
                f"in {len(self.files)} file(s), {self.dtype})")
