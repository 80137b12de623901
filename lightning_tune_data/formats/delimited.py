"""Token files without an index, whose documents a delimiter id marks (Dolma, nanoGPT, llm.c).

Finding the boundaries means reading the ids once: the first open of a file on a node scans it
for the delimiter (and notes its largest id, so ids beyond the tokenizer's vocabulary are found
at setup) and keeps the result (:mod:`lightning_tune_data.formats.kept`); every later open reads
the kept positions. The scan reads the file in blocks of a few million ids.

Two conventions: the delimiter *ends* a document (Dolma, nanoGPT: an EOS after each document; a
tail without one at the end of a file is kept as a document), or it *starts* one (llm.c: the
delimiter before each document; files are cut at a fixed token count, so the document open at the
end of a file continues in the next, and the two parts are joined into one document).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from lightning_tune_data.formats.corpus import CorpusFile
from lightning_tune_data.formats.files import CorpusFiles
from lightning_tune_data.formats.kept import kept_arrays, kept_folder
from lightning_tune_data.formats.options import FormatOptions

__all__ = ["delimiter_positions", "documents_ending_at", "documents_starting_at"]

_BLOCK = 1 << 24


def _scan(tokens: np.ndarray, delimiter: int) -> dict[str, np.ndarray]:
    positions, top = [], -1
    for first in range(0, len(tokens), _BLOCK):
        block = np.asarray(tokens[first : first + _BLOCK])
        positions.append(np.flatnonzero(block == delimiter) + first)
        if len(block):
            top = max(top, int(block.max()))
    found = np.concatenate(positions).astype(np.int64) if positions else np.zeros(0, np.int64)
    return {"delimiters": found, "top": np.array([top], dtype=np.int64)}


def _mapped(path: str, dtype: str, start: int, count: int) -> np.ndarray:
    return np.memmap(path, dtype=dtype, mode="r", offset=start, shape=(count,)) if count else np.zeros(0, dtype)


def _first_at_least(tokens: Any, vocab: int) -> int:
    """The position of the first id ``>= vocab`` (read block by block); ``len(tokens)`` when none."""
    for first in range(0, len(tokens), _BLOCK):
        block = np.asarray(tokens[first : first + _BLOCK])
        over = np.flatnonzero(block >= vocab)
        if len(over):
            return first + int(over[0])
    return len(tokens)


def delimiter_positions(files: CorpusFiles, name: str, path: str, dtype: str, start: int, count: int,
                        delimiter: int, options: FormatOptions) -> np.ndarray:
    """Positions of ``delimiter`` among the ``count`` ids of a file (scanned once, kept).

    Raises:
        ValueError: an id is not below the tokenizer's vocabulary (naming the file, position and id).
    """
    tokens = files.tokens(path, dtype, start, count)
    identity = {**files.identity(name), "url": f"{files.url(name)}#{dtype}@{start}:{delimiter}"}
    kept = kept_arrays(kept_folder(options.local_dir, "delimiters", identity), lambda: _scan(tokens, delimiter))
    vocab = options.vocab_size
    if vocab is not None and int(kept["top"][0]) >= vocab:
        position = _first_at_least(tokens, vocab)
        raise ValueError(
            f"{options.description}: {files.url(name)} holds id {int(tokens[position:position + 1][0])} at token {position} (largest "
            f"{int(kept['top'][0])}), beyond the tokenizer's vocabulary of {vocab}; use the tokenizer that wrote the "
            f"files, or the right dtype (read as {dtype})."
        )
    return np.asarray(kept["delimiters"])


def documents_ending_at(delimiters: np.ndarray, count: int) -> np.ndarray:
    """Cumulative boundaries of documents that each end with a delimiter (a tail without one is kept)."""
    ends = delimiters + 1
    if count and (len(ends) == 0 or ends[-1] < count):
        ends = np.append(ends, count)
    return np.concatenate([[0], ends]).astype(np.int64)


def documents_starting_at(parts: list[tuple[str, str, int, int, np.ndarray, list]], dtype: str,
                          read: Callable[[str, str, int, int], Any] | None = None) -> list[CorpusFile]:
    """Files whose documents each start with a delimiter, a document running on into the next file.

    Args:
        parts: per file in order: ``(url, local path, byte offset of its first id, id count,
            delimiter positions, identity)``.
        dtype: the ids' dtype.
        read: the ids of a file from its local path, dtype, byte offset and count
            (:meth:`~lightning_tune_data.formats.files.CorpusFiles.tokens`; default: memory-mapped).

    Returns:
        Per file its whole documents (read in place), and after it the document continued from it
        into the next files (its parts joined in memory), or the file's open tail at the end.
    """
    width = np.dtype(dtype).itemsize
    read = read or _mapped
    result: list[CorpusFile] = []
    pending: list[np.ndarray] = []  # the parts of the document open across files
    pending_name = ""
    for url, path, start, count, delimiters, identity in parts:
        tokens = read(path, dtype, start, count)
        if len(delimiters) == 0:
            pending.append(np.array(tokens))
            pending_name = pending_name or url
            continue
        first, last = int(delimiters[0]), int(delimiters[-1])
        if first > 0:
            pending.append(np.array(tokens[:first]))
            pending_name = pending_name or url
        if pending:
            joined = np.concatenate(pending)
            result.append(CorpusFile(f"{pending_name} (continued into {url})", dtype,
                                     np.array([0, len(joined)], np.int64), tokens=joined))
            pending, pending_name = [], ""
        offsets = (delimiters - first).astype(np.int64)
        result.append(CorpusFile(url, dtype, offsets, path=path, start=start + first * width, identity=identity))
        pending.append(np.array(tokens[last:]))
        pending_name = url
    if pending:
        joined = np.concatenate(pending)
        result.append(CorpusFile(f"{pending_name} (last document)", dtype, np.array([0, len(joined)], np.int64),
                                 tokens=joined))
    return result
