"""datatrove tokenized files (datatrove, nanotron's Nanosets): ``*.ds`` + ``.ds.index`` [+ ``.ds.loss``].

A ``.ds`` holds token ids (uint16, or uint32 for large vocabularies); ``.ds.index`` holds every
document's end in tokens (uint64, no header); ``.ds.metadata`` (``tokenizer|token_size``, then
the token count) records the token size; ``.ds.loss`` holds one byte per token, non-zero where
the token is a training target, read as the documents' loss mask. Opening reads the index and
metadata only.
"""

from __future__ import annotations

import numpy as np

from lightning_tune_data.formats.corpus import CorpusFile
from lightning_tune_data.formats.files import CorpusFiles
from lightning_tune_data.formats.options import FormatOptions

__all__ = ["open_datatrove"]

_SIZES = {"2": "uint16", "4": "uint32"}


def _token_dtype(files: CorpusFiles, name: str, options: FormatOptions, fetched: dict[str, bytes]) -> str:
    metadata = name + ".metadata"
    if metadata not in fetched:
        if options.dtype is None:
            return "uint16"  # datatrove's default token size
        return options.dtype
    first = (fetched[metadata].decode("utf-8", "replace").splitlines() or [""])[0]
    size = first.rsplit("|", 1)[-1].strip()
    dtype = _SIZES.get(size)
    if dtype is None:
        raise ValueError(f"{options.description}: {files.url(metadata)} records token size {size!r}; expected 2 or 4.")
    options.check_recorded_dtype(dtype, files.url(metadata), " (the metadata says it)")
    return dtype


def open_datatrove(files: CorpusFiles, names: list[str], options: FormatOptions) -> list[CorpusFile]:
    """Every ``.ds`` file among ``names`` with its index, in name order.

    Raises:
        ValueError: a ``.ds`` without its ``.ds.index``, an index that does not match the token
            file's size, or loss files for some token files only.
    """
    listing = files.listing()
    result = []
    tokens = [name for name in names if name.endswith(".ds")]
    with_loss = [name for name in tokens if name + ".loss" in listing]
    if with_loss and len(with_loss) != len(tokens):
        missing = [files.url(name) for name in tokens if name + ".loss" not in listing]
        raise ValueError(f"{options.description}: some .ds files have a .ds.loss mask and {missing[:3]} have none; "
                         "give every file its mask or remove them all.")
    small = [name + suffix for name in tokens for suffix in (".index", ".metadata") if name + suffix in listing]
    indexes = files.read_many(small)  # fetched once per node, together
    for name in tokens:
        index = name + ".index"
        if index not in listing:
            raise ValueError(f"{options.description}: {files.url(name)} has no .ds.index beside it; copy it (datatrove "
                             "writes it with save_index=True).")
        dtype = _token_dtype(files, name, options, indexes)
        ends = np.frombuffer(indexes[index], dtype="<u8").astype(np.int64)
        offsets = np.concatenate([[0], ends]).astype(np.int64)
        width = np.dtype(dtype).itemsize
        size = listing[name]["size"]
        if np.any(np.diff(offsets) < 0) or size != int(offsets[-1]) * width:
            raise ValueError(f"{options.description}: {files.url(name)} has {size} bytes but its index ends at token "
                             f"{int(offsets[-1])} ({int(offsets[-1]) * width} bytes of {dtype}): truncated, or the "
                             "wrong token size; copy the files again.")
        identity = [files.identity(name), files.identity(index)]
        loss_path = None
        if name in with_loss:
            loss = name + ".loss"
            if listing[loss]["size"] != int(offsets[-1]):
                raise ValueError(f"{options.description}: {files.url(loss)} has {listing[loss]['size']} bytes for "
                                 f"{int(offsets[-1])} tokens; copy it again.")
            loss_path = files.local(loss)
            identity.append(files.identity(loss))
        result.append(CorpusFile(files.url(name), dtype, offsets, path=files.local(name), loss_path=loss_path,
                                 identity=identity))
    return result
