"""Results worked out once per file and node, kept on disk: delimiter scans and decoded files.

Formats without an index (Dolma, nanoGPT, llm.c) find their document boundaries by scanning the
token ids for the delimiter (kept: 8 bytes per document); MDS shards keep each sample's position
(or, when their ids must be copied out, one token file), LitData chunks whose ids are unaligned
one token file. Either is done the first time a node opens the file and kept under
``<local_cache_dir>/tokenized/kept/``, keyed by the file's URL, size and identity, so later opens
(every rank, every run) read it back as memory-mapped arrays. A kept result is written to a
temporary folder and renamed: a killed scan is never used. Kept results are outside the node's
``cache_budget``; a remote corpus with a budget keeps no token file here (its shards are decoded
into the node's shard cache instead).
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lightning_tune_data.formats.files import LOCAL_COPIES_FOLDER

__all__ = ["kept_arrays", "kept_folder", "kept_path"]

_DONE = "done"


def kept_folder(local_dir: Path, kind: str, identity: dict[str, Any]) -> Path:
    """The folder of the result of ``kind`` for the file of ``identity`` (``{"url", "size", "stamp"}``)."""
    key = hashlib.sha256(f"{kind}\0{identity['url']}\0{identity['size']}\0{identity['stamp']}".encode()).hexdigest()[:24]
    return Path(local_dir) / LOCAL_COPIES_FOLDER / "kept" / key


def kept_arrays(folder: Path, compute: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The arrays kept in ``folder`` (memory-mapped), computed and kept first when missing.

    Args:
        folder: from :func:`kept_folder`.
        compute: works the arrays out (name -> array).
    """
    if not (folder / _DONE).is_file():
        arrays = compute()
        partial = folder.with_name(f".{folder.name}.{os.getpid()}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for name, array in arrays.items():
            np.save(partial / f"{name}.npy", np.ascontiguousarray(array))
        (partial / _DONE).write_text("ok", encoding="utf-8")
        if folder.is_dir() and not (folder / _DONE).is_file():
            shutil.rmtree(folder, ignore_errors=True)  # not ours: a folder without its marker is never read
        try:
            os.replace(partial, folder)
        except OSError:  # another process kept it first
            shutil.rmtree(partial, ignore_errors=True)
    return {path.stem: np.load(path, mmap_mode="r") for path in sorted(folder.glob("*.npy"))}


def kept_path(folder: Path, name: str) -> tuple[str, int]:
    """The file of kept array ``name`` and the byte offset of its first item (to memory-map it)."""
    path = folder / f"{name}.npy"
    return str(path), int(np.load(path, mmap_mode="r").offset)
