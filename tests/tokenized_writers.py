"""Tokenized corpora written by the tools themselves (Megatron-Core, datatrove, LitData, MosaicML
Streaming) or, for the raw formats (Dolma, nanoGPT, llm.c), with NumPy from their layouts: what the
format tests read back and compare with each tool's own reader."""

from __future__ import annotations

import importlib.util
import sys
import types
import warnings
from pathlib import Path

import numpy as np

EOS = 999


def documents(count: int, seed: int, vocab: int = 1000, eos: int | None = EOS, longest: int = 40) -> list[np.ndarray]:
    """``count`` random documents of ids below ``vocab`` (each ending with ``eos`` when given, which
    appears nowhere else)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        ids = rng.integers(0, vocab - 1 if eos is not None else vocab, size=int(rng.integers(1, longest)))
        if eos is not None:
            ids = np.where(ids == eos, 0, ids)
            ids = np.append(ids, eos)
        out.append(ids.astype(np.int64))
    return out


def write_megatron(prefix: Path, docs: list[np.ndarray], dtype=np.uint16) -> None:
    """``prefix.bin`` / ``prefix.idx`` written by Megatron-Core's ``IndexedDatasetBuilder``."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
    prefix.parent.mkdir(parents=True, exist_ok=True)
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for doc in docs:
        builder.add_item(torch.from_numpy(doc))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")


def megatron_documents(prefix: Path) -> list[np.ndarray]:
    """Every sequence as Megatron-Core's ``IndexedDataset`` reads it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    dataset = IndexedDataset(str(prefix))
    return [np.array(dataset[i], copy=True) for i in range(len(dataset))]  # its views die with it


def write_datatrove(folder: Path, name: str, docs: list[np.ndarray], losses: list[np.ndarray] | None = None,
                    token_size: int = 2) -> None:
    """``name`` (+ ``.index``, ``.metadata``[, ``.loss``]) written by datatrove's ``TokenizedFile``."""
    from datatrove.pipeline.tokens.tokenizer import TokenizedFile

    folder.mkdir(parents=True, exist_ok=True)
    writer = TokenizedFile(str(folder), name, save_loss_metadata=losses is not None, save_final_metadata=True,
                           tokenizer_name_or_path="test-tokenizer", token_size=token_size)
    for i, doc in enumerate(docs):
        writer.write(doc.tolist(), None if losses is None else losses[i])
    writer.close()


def datatrove_windows(path: Path, seq_len: int) -> list[np.ndarray]:
    """A ``.ds`` file's windows as datatrove's own ``DatatroveFileDataset`` hands them out (window
    ``i`` is the ``seq_len + 1`` ids from ``i * (seq_len + 1)``)."""
    from datatrove.utils.dataset import DatatroveFileDataset

    dataset = DatatroveFileDataset(str(path), seq_len=seq_len, token_size=2)
    return [np.asarray(dataset[i]["input_ids"]) for i in range(len(dataset))]


def write_raw(path: Path, docs: list[np.ndarray], dtype: str = "uint16") -> None:
    """The documents' ids back to back with no header (Dolma ``.npy``, nanoGPT ``.bin``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.concatenate(docs).astype(dtype).tofile(path)


def write_llmc(folder: Path, docs: list[np.ndarray], shard_tokens: int, dtype: str = "uint16") -> list[Path]:
    """llm.c shards: the delimiter before each document, files cut every ``shard_tokens`` ids, each
    with llm.c's 256 x int32 header (as its ``write_datafile``)."""
    folder.mkdir(parents=True, exist_ok=True)
    stream = np.concatenate(docs).astype(dtype)
    paths = []
    for number, first in enumerate(range(0, len(stream), shard_tokens)):
        part = stream[first : first + shard_tokens]
        header = np.zeros(256, dtype=np.int32)
        header[0], header[1] = (20240520, 1) if dtype == "uint16" else (20240801, 7)
        header[2] = len(part)
        path = folder / f"train_{number:06d}.bin"
        with open(path, "wb") as handle:
            handle.write(header.tobytes())
            handle.write(part.tobytes())
        paths.append(path)
    return paths


def write_litdata(folder: Path, docs: list[np.ndarray], tokens_loader: bool, dtype=np.uint16) -> None:
    """A LitData dataset written by its ``BinaryWriter`` (what ``optimize`` runs in each worker):
    one document per item, with the ``TokensLoader`` or the default ``PyTreeLoader``."""
    from litdata.streaming.item_loader import TokensLoader
    from litdata.streaming.writer import BinaryWriter

    loader = TokensLoader() if tokens_loader else None
    writer = BinaryWriter(str(folder), chunk_bytes=600, item_loader=loader)
    for i, doc in enumerate(docs):
        writer[i] = doc.astype(dtype)
    writer.done()
    writer.merge()


def litdata_documents(folder: Path) -> list[np.ndarray]:
    """Every item as LitData's ``StreamingDataset`` reads it (in the dataset's own order)."""
    from litdata import StreamingDataset

    dataset = StreamingDataset(str(folder))
    return [np.asarray(dataset[i]) for i in range(len(dataset))]


def litdata_token_stream(folder: Path) -> np.ndarray:
    """The token stream as LitData's ``StreamingDataset`` with litgpt's ``TokensLoader`` hands it out
    (blocks of one id, so no chunk's tail is left out), joined."""
    from litdata import StreamingDataset, TokensLoader

    dataset = StreamingDataset(str(folder), item_loader=TokensLoader(block_size=1))
    return np.concatenate([np.asarray(dataset[i]) for i in range(len(dataset))])


def _streaming_base():
    """MosaicML Streaming's ``streaming.base`` (its package root also imports vision extras that need
    torchvision, which is not installed: the root is bypassed, the writer and reader are the tool's)."""
    if "streaming" not in sys.modules:
        spec = importlib.util.find_spec("streaming")
        package = types.ModuleType("streaming")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["streaming"] = package
    import streaming.base as base

    return base


def write_mds(folder: Path, docs: list[np.ndarray], compression: str | None, dtype: str = "int32") -> None:
    """An MDS dataset written by MosaicML Streaming's ``MDSWriter`` (llm-foundry's ``tokens`` column)."""
    base = _streaming_base()
    with base.MDSWriter(out=str(folder), columns={"tokens": f"ndarray:{dtype}", "id": "int"},
                        compression=compression, size_limit=700) as writer:
        for i, doc in enumerate(docs):
            writer.write({"tokens": doc.astype(dtype), "id": i})


def mds_documents(folder: Path) -> list[np.ndarray]:
    """Every sample's tokens as MosaicML Streaming's ``LocalDataset`` reads them (compressed shards
    are first decompressed beside them with the tool's own codec, as its ``StreamingDataset`` does)."""
    import json

    base = _streaming_base()
    from streaming.base.compression import decompress

    for shard in json.loads((folder / "index.json").read_text())["shards"]:
        if shard.get("zip_data"):
            raw = decompress(shard["compression"], (folder / shard["zip_data"]["basename"]).read_bytes())
            (folder / shard["raw_data"]["basename"]).write_bytes(raw)
    dataset = base.LocalDataset(str(folder))
    return [np.asarray(dataset[i]["tokens"]) for i in range(len(dataset))]
