"""Helpers the packing tests share: generated documents and streams, pack comparisons."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pyarrow as pa
import torch

from lightning_tune_data.mixing.interleave import InterleavedDataset
from lightning_tune_data.sources.arrow import ArrowSource
from lightning_tune_data.sources.memory import InMemoryStream

STRATEGIES = ["greedy", "best_fit", "concat"]
ARRAY_KEYS = ["input_ids", "labels", "position_ids", "document_ids"]


def random_docs(n: int, seed: int, max_len: int = 40, base: int = 0, with_mask: bool = False) -> list:
    """Documents with distinct token ids (``base + 1000*i + j``); optionally a random loss mask."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(n):
        length = int(rng.integers(1, max_len + 1))
        ids = base + 1000 * i + np.arange(length)
        if with_mask:
            docs.append({"input_ids": ids, "loss_mask": rng.random(length) < 0.7})
        else:
            docs.append(ids)
    return docs


def lognormal_lengths(n: int, mean: float = 300.0, sigma: float = 1.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mu = np.log(mean) - sigma**2 / 2  # E[lognormal] = exp(mu + sigma^2 / 2) = mean
    return np.maximum(1, np.round(rng.lognormal(mu, sigma, n))).astype(np.int64)


def token_table(num_rows: int, seed: int = 0, max_len: int = 90, empty_every: int = 0) -> pa.Table:
    """An Arrow table of ``num_rows`` random int32 documents (every ``empty_every``-th one empty)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len, size=num_rows)
    if empty_every:
        lengths[::empty_every] = 0
    docs = [rng.integers(0, 1000, size=n).astype(np.int32) for n in lengths]
    return pa.table({"input_ids": pa.array(docs, type=pa.list_(pa.int32()))})


class DocumentsOnly(ArrowSource):
    """The same source, read one document dict at a time (block reading switched off)."""

    def blocks_supported(self) -> bool:
        return False


def roundtrip(state: dict) -> dict:
    """``state`` saved and loaded as a checkpoint would be."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def assert_same_packs(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        for key in ARRAY_KEYS:
            assert g[key].dtype == w[key].dtype and np.array_equal(g[key], w[key]), key
        assert g["seq_lens"] == w["seq_lens"]
        assert g["provenance"] == w["provenance"]


def flat_docs(packs: list[dict]) -> list[list[int]]:
    """Every piece's tokens, packs back to back."""
    out = []
    for pack in packs:
        start = 0
        for length in pack["seq_lens"]:
            out.append(pack["input_ids"][start : start + length].tolist())
            start += length
    return out


def make_interleaved() -> InterleavedDataset:
    """An endless mixture of a masked and a plain source."""
    a = InMemoryStream(random_docs(40, 6, max_len=30, with_mask=True), "a", seed=1)
    b = InMemoryStream(random_docs(25, 7, max_len=70, base=100_000), "b", seed=2)
    return InterleavedDataset([a, b], [0.6, 0.4], seed=3)


def make_finite() -> InMemoryStream:
    """A source of two passes."""
    return InMemoryStream(random_docs(60, 8, max_len=50), "f", seed=4, num_passes=2)


def assert_taking_packs_equals_one_at_a_time(make, count: int) -> None:
    """``take(count)`` hands out the packs, counters and state of ``count`` calls of ``next``, through
    the end of a finite child, and a new ``iter()`` starts the same new round."""
    one, many = make(), make()
    for round_number in range(2):  # a finite child's round, then the next one (which may be empty)
        singles, batches = iter(one), iter(many)
        takes = 0
        while True:
            got = batches.take(count)
            want = list(itertools.islice(singles, count))
            assert_same_packs([dict(pack) for pack in got], [dict(pack) for pack in want])
            assert many.state_dict() == one.state_dict() and many.counters == one.counters
            if snapshot := getattr(many, "snapshot", None):
                assert snapshot()() == one.state_dict()
            takes += 1
            if len(got) < count:
                break
        assert takes > 3 or round_number
        assert batches.take(count) == [] and next(singles, None) is None
        assert many.state_dict() == one.state_dict()
        assert next(iter(many.state_dict().values()))["finished"]  # the round is over: iter() starts a new one
