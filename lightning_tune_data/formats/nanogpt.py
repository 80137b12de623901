"""nanoGPT and llm.c token files (``.bin``).

* nanoGPT: raw uint16 ids, each document followed by EOS (``<|endoftext|>``).
* llm.c (and modded-nanogpt): a header of 256 int32 (magic 20240520 with version 1: uint16 ids;
  magic 20240801 with version 7: uint32; then the token count), then the ids with the delimiter
  *before* each document (GPT-2's ``<|endoftext|>``, llama-3's ``<|begin_of_text|>``). Files are cut
  at a fixed token count, so a document runs on into the next file; its parts are joined.
"""

from __future__ import annotations

import numpy as np

from lightning_tune_data.formats.corpus import CorpusFile
from lightning_tune_data.formats.delimited import delimiter_positions, documents_ending_at, documents_starting_at
from lightning_tune_data.formats.files import CorpusFiles
from lightning_tune_data.formats.options import FormatOptions

__all__ = ["LLMC_HEADER_BYTES", "LLMC_MAGICS", "llmc_header", "open_llmc", "open_nanogpt"]

#: llm.c's magic number -> (version, dtype).
LLMC_MAGICS = {20240520: (1, "uint16"), 20240801: (7, "uint32")}
LLMC_HEADER_BYTES = 256 * 4


def llmc_header(data: bytes) -> tuple[int, int, int] | None:
    """``(magic, version, token count)`` of an llm.c header, ``None`` when ``data`` does not start with one."""
    if len(data) < 12:
        return None
    magic, version, count = (int(x) for x in np.frombuffer(data[:12], dtype="<i4"))
    return (magic, version, count) if magic in LLMC_MAGICS else None


def open_nanogpt(files: CorpusFiles, names: list[str], options: FormatOptions) -> list[CorpusFile]:
    """Every ``.bin`` among ``names`` as raw EOS-delimited ids, in name order."""
    dtype = options.dtype or "uint16"
    width = np.dtype(dtype).itemsize
    eos = options.need_eos("nanogpt")
    result = []
    for name in names:
        if not name.endswith(".bin"):
            continue
        size = files.listing()[name]["size"]
        if size % width:
            raise ValueError(f"{options.description}: {files.url(name)} has {size} bytes, not whole {dtype} ids; set "
                             "dtype, or copy the file again (it may be truncated).")
        path, count = files.local(name), size // width
        offsets = documents_ending_at(delimiter_positions(files, name, path, dtype, 0, count, eos, options), count)
        result.append(CorpusFile(files.url(name), dtype, offsets, path=path, identity=[files.identity(name)]))
    return result


def open_llmc(files: CorpusFiles, names: list[str], options: FormatOptions) -> list[CorpusFile]:
    """Every llm.c ``.bin`` among ``names``, documents joined across files, in name order.

    Raises:
        ValueError: a file without the header, a dtype contradicting it, or a truncated file.
    """
    delimiter = options.need_eos("llmc")
    parts, dtype = [], None
    heads = files.read_heads({name: 12 for name in names if name.endswith(".bin")})  # once per node
    for name in names:
        if not name.endswith(".bin"):
            continue
        header = llmc_header(heads[name])
        if header is None:
            raise ValueError(f"{options.description}: {files.url(name)} has no llm.c header (magic 20240520 or "
                             "20240801); use format: nanogpt for raw ids.")
        magic, version, count = header
        expected_version, file_dtype = LLMC_MAGICS[magic]
        if version != expected_version or (options.dtype is not None and options.dtype != file_dtype):
            raise ValueError(f"{options.description}: {files.url(name)}'s header (magic {magic}, version {version}) "
                             f"means {file_dtype} ids, contradicting dtype={options.dtype!r}; remove the dtype option.")
        if dtype is not None and dtype != file_dtype:
            raise ValueError(f"{options.description}: {files.url(name)} holds {file_dtype} ids, the files before it "
                             f"{dtype}; one source reads one dtype.")
        dtype = file_dtype
        size = files.listing()[name]["size"]
        expected = LLMC_HEADER_BYTES + count * np.dtype(dtype).itemsize
        if size != expected:
            raise ValueError(f"{options.description}: {files.url(name)} has {size} bytes but its header says {count} "
                             f"tokens ({expected} bytes): truncated or overwritten; copy it again.")
        path = files.local(name)
        found = delimiter_positions(files, name, path, dtype, LLMC_HEADER_BYTES, count, delimiter, options)
        parts.append((files.url(name), path, LLMC_HEADER_BYTES, count, found, [files.identity(name)]))
    return documents_starting_at(parts, dtype or "uint16", files.tokens)
