"""Peer library on the hot path: LitData's ``StreamingDataset``, side by side with ours (benchmark 9).

LitData is the library a user would most likely pick instead of ours for tokenized text. It is
optional here (``pip install litdata``); without it, section 9 says so in its rows and measures
everything else. Both of its paths read the same 200k-document corpus as ours, converted once
with ``litdata.optimize`` into ``benchmarks/.data`` (about 15 s each with 2 workers, in a child
process, so that no helper process it starts outlives it and disturbs later measurements):

* **documents**: one item per document (``{"input_ids": int32 array}``), read by
  ``StreamingDataset(shuffle=True)`` in a ``StreamingDataLoader``, batches of 16 padded by the
  collate the caller gives (section 9 gives the padded floor's, so that the peer is not slowed by a
  naive collate). The comparison for our unpacked path.
* **token blocks**: the documents' tokens back to back, read as shuffled 2049-token blocks by
  ``TokensLoader(block_size=2049)``; each batch of 8 becomes ``int64`` inputs and shifted labels
  (:class:`BlockCollate`). What LitData offers for pretraining; the comparison for ``concat``.
  It shuffles blocks, not documents, and builds no ``position_ids``/``document_ids``.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

LITDATA_HINT = "LitData is not installed: pip install litdata (keeping your torch version)"

DOCUMENTS_PER_SHARD = 1000


def litdata_version() -> str | None:
    """LitData's version, ``None`` when it is not installed."""
    if importlib.util.find_spec("litdata") is None:
        return None
    import litdata

    return litdata.__version__


def _optimized(path: Path, flat_path: Path, offsets_path: Path, as_tokens: bool) -> Path:
    """``path``, written once by ``litdata.optimize`` (in a child process) from the flat tokens."""
    if not (path / "index.json").exists():
        kind = "tokens" if as_tokens else "documents"
        subprocess.run([sys.executable, __file__, str(path), str(flat_path), str(offsets_path), kind], check=True)
    return path


def _optimize(path: Path, flat_path: Path, offsets_path: Path, as_tokens: bool) -> None:
    """Convert the flat tokens to LitData's format: one item per document, or token blocks."""
    from litdata import TokensLoader, optimize

    shutil.rmtree(path, ignore_errors=True)
    offsets = np.load(offsets_path)
    shards = list(range((len(offsets) - 1 + DOCUMENTS_PER_SHARD - 1) // DOCUMENTS_PER_SHARD))
    kwargs: dict[str, Any] = {"item_loader": TokensLoader(), "chunk_size": 2049 * 1024} if as_tokens else {"chunk_bytes": "64MB"}
    reader = _TokenShards(flat_path, offsets_path, as_tokens)
    optimize(fn=reader, inputs=shards, output_dir=str(path), num_workers=min(2, len(shards)), mode="overwrite", **kwargs)


class _TokenShards:
    """``optimize``'s function: the documents of one shard, as token arrays or ``input_ids`` dicts."""

    def __init__(self, flat_path: Path, offsets_path: Path, as_tokens: bool) -> None:
        self.flat_path, self.offsets_path, self.as_tokens = flat_path, offsets_path, as_tokens

    def __call__(self, shard: int) -> Iterator[Any]:
        flat, offsets = np.load(self.flat_path, mmap_mode="r"), np.load(self.offsets_path)
        first = shard * DOCUMENTS_PER_SHARD
        for doc in range(first, min(first + DOCUMENTS_PER_SHARD, len(offsets) - 1)):
            tokens = np.array(flat[offsets[doc] : offsets[doc + 1]])
            yield tokens if self.as_tokens else {"input_ids": tokens}


class BlockCollate:
    """Token blocks ``[B, 2049]`` into int64 ``input_ids = w[:, :-1]`` and ``labels = w[:, 1:]``
    (and ``num_tokens``, every input token, for the throughput loop's count)."""

    def __call__(self, blocks: list[np.ndarray]) -> dict[str, Any]:
        window = torch.from_numpy(np.stack(blocks).astype(np.int64))
        inputs = window[:, :-1]
        return {"input_ids": inputs, "labels": window[:, 1:], "num_tokens": inputs.numel()}


def litdata_documents_loader(data_dir: Path, flat_path: Path, offsets_path: Path, num_docs: int, batch_size: int,
                             collate_fn: Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]], seed: int) -> Any:
    """LitData's shuffled documents (``{"input_ids": array}`` items), batches of ``batch_size`` made
    by ``collate_fn`` (converted on first use from the flat tokens ``flat_path`` and their document
    offsets ``offsets_path``)."""
    from litdata import StreamingDataLoader, StreamingDataset

    path = _optimized(data_dir / f"litdata_documents_{num_docs}", flat_path, offsets_path, as_tokens=False)
    dataset = StreamingDataset(str(path), shuffle=True, seed=seed)
    return StreamingDataLoader(dataset, batch_size=batch_size, drop_last=True, collate_fn=collate_fn)


def litdata_blocks_loader(data_dir: Path, flat_path: Path, offsets_path: Path, num_docs: int, batch_size: int,
                          seq: int, seed: int) -> Any:
    """LitData's shuffled ``seq + 1``-token blocks of the concatenated documents, batches of ``batch_size``."""
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    path = _optimized(data_dir / f"litdata_tokens_{num_docs}", flat_path, offsets_path, as_tokens=True)
    dataset = StreamingDataset(str(path), item_loader=TokensLoader(block_size=seq + 1), shuffle=True, seed=seed)
    return StreamingDataLoader(dataset, batch_size=batch_size, drop_last=True, collate_fn=BlockCollate())


if __name__ == "__main__":  # the child process of _optimized: output dir, flat tokens, offsets, "tokens"/"documents"
    _optimize(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), as_tokens=sys.argv[4] == "tokens")
