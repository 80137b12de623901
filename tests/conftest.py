"""Shared fixtures: small generated text corpora on disk and a callback that records batches."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback


def make_texts(count: int, seed: int, prefix: str = "", min_words: int = 2, max_words: int = 40) -> list[str]:
    """``count`` distinct texts with varied lengths (a ``prefix`` tells sources apart)."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "data", "stream", "resume", "token", "pack", "mix", "rank", "worker"]
    return [f"{prefix}{i}: " + " ".join(rng.choice(words) for _ in range(rng.randint(min_words, max_words))) for i in range(count)]


def write_jsonl(path: Path, texts: list[str], column: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for text in texts:
            handle.write(json.dumps({column: text}) + "\n")
    return path


def assert_valid_png(path: Path) -> None:
    """``path`` is a readable PNG of at least 100 x 100 pixels that is not blank."""
    import matplotlib.image
    import numpy as np
    from PIL import Image

    with Image.open(path) as image:
        image.verify()
        assert image.format == "PNG"
    pixels = matplotlib.image.imread(path)
    assert pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert float(np.std(pixels)) > 0.01, f"{path.name} is blank"


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    """Two small JSONL sources (``a``: 61 docs, ``b``: 47 docs) and a val file."""
    write_jsonl(tmp_path / "a.jsonl", make_texts(61, seed=1, prefix="A"))
    write_jsonl(tmp_path / "b.jsonl", make_texts(47, seed=2, prefix="B"))
    write_jsonl(tmp_path / "val.jsonl", make_texts(13, seed=3, prefix="V"))
    return tmp_path


class BatchRecorder(Callback):
    """Records (global step, batch tensors) of every batch the model trains on."""

    def __init__(self) -> None:
        self.batches: list[dict[str, torch.Tensor]] = []
        self.steps: list[int] = []
        self.provenance: list[dict] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        self.steps.append(trainer.global_step)
        self.batches.append({k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)})
        self.provenance.append({k: list(v) for k, v in batch.get("provenance", {}).items()})
