"""Opening a tokenized corpus in any supported format: one reader per format, one description out.

:func:`open_corpus` lists the files, detects the format (or takes the one given), hands that
format's files to its reader and checks what the readers cannot check alone: one token dtype for
the whole corpus, at least one document. Ids beyond the tokenizer's vocabulary are found at setup by the formats that scan
their ids anyway (Dolma, nanoGPT, llm.c); a dtype that cannot hold an id that large needs no check;
the other formats' files are checked when a document of theirs is first read (opening stays
metadata-only), naming the file and the position.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from lightning_tune_data.formats.corpus import CorpusFile, TokenCorpus
from lightning_tune_data.formats.datatrove import open_datatrove
from lightning_tune_data.formats.detect import detect_format, format_files
from lightning_tune_data.formats.dolma import open_dolma
from lightning_tune_data.formats.files import CorpusFiles
from lightning_tune_data.formats.litdata import open_litdata
from lightning_tune_data.formats.mds import open_mds
from lightning_tune_data.formats.megatron import open_megatron
from lightning_tune_data.formats.nanogpt import open_llmc, open_nanogpt
from lightning_tune_data.formats.options import FormatOptions

__all__ = ["READERS", "open_corpus"]

#: Formats whose ids are scanned at open (and so checked against the vocabulary there).
_SCANNED = ("dolma", "nanogpt", "llmc")

#: Each foreign format's reader: ``(files, names, options) -> [CorpusFile]``.
READERS: dict[str, Callable[[CorpusFiles, list[str], FormatOptions], list[CorpusFile]]] = {
    "megatron": open_megatron,
    "datatrove": open_datatrove,
    "dolma": open_dolma,
    "nanogpt": open_nanogpt,
    "llmc": open_llmc,
    "litdata": open_litdata,
    "mds": open_mds,
}


def open_corpus(files: CorpusFiles, format: str, options: FormatOptions) -> TokenCorpus:
    """The corpus at ``files`` read as ``format`` (``"auto"``: detected).

    Raises:
        FileNotFoundError: the path matches nothing.
        ValueError: an unknown or mixed layout, a reader's complaint, several dtypes, no
            document, or (where the dtype allows) ids beyond the vocabulary.
    """
    found = format_files(files)
    chosen = detect_format(files, options.description, found) if format == "auto" else format
    names = sorted(name for kind, group in found.items() for name in group
                   if kind == chosen or (chosen in ("nanogpt", "llmc") and kind in ("nanogpt", "llmc")))
    if not names:
        raise ValueError(f"{options.description}: format={chosen!r} but no {chosen} file is at {files.path} (found "
                         f"{', '.join(f'{len(v)} {k}' for k, v in found.items())}); fix path or use format: auto.")
    entries = READERS[chosen](files, names, options)
    dtypes = {entry.dtype for entry in entries}
    if len(dtypes) > 1:
        first = {dtype: next(entry.name for entry in entries if entry.dtype == dtype) for dtype in sorted(dtypes)}
        raise ValueError(f"{options.description}: the files hold ids of several dtypes ({first}); one source reads "
                         "one dtype: split them into two sources.")
    corpus = TokenCorpus(entries, chosen, files.path)
    if len(corpus) == 0:
        raise ValueError(f"{options.description}: the {chosen} files at {files.path} hold no document (empty corpus); "
                         "check the path.")
    vocab = options.vocab_size
    if vocab is not None and chosen not in _SCANNED and np.iinfo(np.dtype(corpus.dtype)).max >= vocab:
        corpus.id_check = (int(vocab), str(options.local_dir))  # checked as each file is first read
    return corpus
