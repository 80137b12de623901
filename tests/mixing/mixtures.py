"""Small streams and mixtures the mixing tests share."""

from __future__ import annotations

import io

import torch

from lightning_tune_data.mixing.interleave import InterleavedDataset
from lightning_tune_data.sources.memory import InMemoryStream

WEIGHTS = {"a": 0.7, "b": 0.2, "c": 0.1}
_FIRST_ID = {"a": 0, "b": 10_000, "c": 20_000, "d": 30_000, "x": 40_000, "y": 50_000}


def stream(name: str, n: int, *, seed: int = 0, num_passes: int | None = None, rank: int = 0,
           world_size: int = 1, shuffle: bool = True) -> InMemoryStream:
    """``n`` documents ``[k, k]`` with ``k`` unique per (name, index)."""
    base = _FIRST_ID[name]
    return InMemoryStream([[base + i, base + i] for i in range(n)], name, seed=seed, shuffle=shuffle,
                          num_passes=num_passes, rank=rank, world_size=world_size)


def mixture(rank: int = 0, world_size: int = 1, seed: int = 123) -> InterleavedDataset:
    """``WEIGHTS`` over three 64-document streams."""
    children = [stream(n, 64, seed=i, rank=rank, world_size=world_size) for i, n in enumerate(WEIGHTS)]
    return InterleavedDataset(children, list(WEIGHTS.values()), seed=seed, rank=rank, world_size=world_size)


def roundtrip(state: dict) -> dict:
    """``state`` through ``torch.save``/``torch.load(weights_only=True)``, as a checkpoint carries it."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def key(sample: dict) -> tuple:
    """What identifies a document in a mixture's output."""
    return (sample["source"], sample["epoch"], tuple(sample["input_ids"].tolist()))
