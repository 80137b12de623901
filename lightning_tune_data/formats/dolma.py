"""OLMo / Dolma token files: raw ids named ``.npy`` with no NumPy header (uint16, or uint32 for the
dolma2 tokenizer), documents ending at EOS, or cut by a ``.csv.gz`` beside the file
(``start,end`` in tokens per document, as OLMo's metadata files hold).
"""

from __future__ import annotations

import gzip

import numpy as np

from lightning_tune_data.formats.corpus import CorpusFile
from lightning_tune_data.formats.delimited import delimiter_positions, documents_ending_at
from lightning_tune_data.formats.files import CorpusFiles
from lightning_tune_data.formats.options import FormatOptions

__all__ = ["NUMPY_MAGIC", "open_dolma"]

NUMPY_MAGIC = b"\x93NUMPY"


def _sidecar_offsets(files: CorpusFiles, sidecar: str, count: int, options: FormatOptions) -> np.ndarray:
    text = gzip.decompress(files.read_bytes(sidecar)).decode("utf-8")
    rows = [line.split(",")[:2] for line in text.splitlines() if line.strip()]
    try:
        spans = np.array([[int(a), int(b)] for a, b in rows], dtype=np.int64).reshape(-1, 2)
    except ValueError:
        raise ValueError(f"{options.description}: {files.url(sidecar)} is not 'start,end' rows of token positions.") from None
    if len(spans) == 0 or spans[0, 0] != 0 or np.any(spans[1:, 0] != spans[:-1, 1]) or spans[-1, 1] > count:
        raise ValueError(f"{options.description}: the documents of {files.url(sidecar)} do not follow one another from "
                         f"token 0 within the file's {count} tokens; remove it to cut documents at EOS instead.")
    offsets = np.concatenate([[0], spans[:, 1]]).astype(np.int64)
    return offsets if offsets[-1] == count else np.append(offsets, count)


def open_dolma(files: CorpusFiles, names: list[str], options: FormatOptions) -> list[CorpusFile]:
    """Every ``.npy`` token file among ``names``, in name order.

    Raises:
        ValueError: a real NumPy file (with a header), a size that is not whole ids, or no EOS id.
    """
    dtype = options.dtype or "uint16"
    width = np.dtype(dtype).itemsize
    listing = files.listing()
    result = []
    heads = files.read_heads({name: 6 for name in names if name.endswith(".npy")})  # once per node
    for name in names:
        if not name.endswith(".npy"):
            continue
        if heads[name] == NUMPY_MAGIC:
            raise ValueError(f"{options.description}: {files.url(name)} is a NumPy file with a header, not a Dolma "
                             "token file; Dolma files are raw ids.")
        size = listing[name]["size"]
        if size % width:
            raise ValueError(f"{options.description}: {files.url(name)} has {size} bytes, not whole {dtype} ids; set "
                             "dtype (uint32 for the dolma2 tokenizer) or copy the file again.")
        count = size // width
        sidecar = name[: -len(".npy")] + ".csv.gz"
        path = files.local(name)
        identity = [files.identity(name)]
        if sidecar in listing:
            offsets = _sidecar_offsets(files, sidecar, count, options)
            identity.append(files.identity(sidecar))
            if options.vocab_size is not None and options.eos_id is not None:
                delimiter_positions(files, name, path, dtype, 0, count, options.eos_id, options)
        else:
            eos = options.need_eos("dolma")
            offsets = documents_ending_at(delimiter_positions(files, name, path, dtype, 0, count, eos, options), count)
        result.append(CorpusFile(files.url(name), dtype, offsets, path=path, identity=identity))
    return result
