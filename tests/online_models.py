"""Shared pieces of the online mixing tests: two sources with very different loss levels, a model
whose per-token loss is a fixed function of the token, and a datamodule over them."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch
from conftest import write_jsonl

from lightning_tune_data import Harness, LocalDatasetManager, TextDataModule
from lightning_tune_data.keys import IGNORE_INDEX, INPUT_IDS, LABELS


def write_sources(root: Path, count: int = 120) -> Path:
    """``low``: digits (bytes 48..57), ``high``: lowercase letters (bytes 97..122); varied lengths."""
    rng = random.Random(5)
    write_jsonl(root / "low.jsonl", ["".join(rng.choice("0123456789") for _ in range(rng.randint(3, 30)))
                                     for _ in range(count)])
    write_jsonl(root / "high.jsonl", ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 30)))
                                      for _ in range(count)])
    return root


class LevelModel(Harness):
    """Per-token loss ``(1 if label < 64 else 4) * (1 + w)`` with ``w`` a trained parameter starting at 0:
    a real optimisation whose loss level depends on the source (digits ~1.2, letters 4)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def step_outputs(self, batch: dict[str, Any]) -> dict[str, Any]:
        labels = batch[LABELS]
        target = labels != IGNORE_INDEX
        value = torch.where(labels < 64, 1.0, 4.0) * (1.0 + self.w)
        token_loss = torch.where(target, value, torch.zeros_like(value))
        count = target.sum().clamp(min=1)
        return {"loss": token_loss.sum() / count, "num_tokens": count, "token_loss": token_loss}

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def online_datamodule(root: Path, **options: Any) -> TextDataModule:
    """A two-source datamodule with the built-in controller updating every 2 steps (``options`` override)."""
    settings: dict[str, Any] = dict(max_seq_len=32, batch_size=4, num_workers=2, seed=3,
                                    mix_controller={"class_path": "lightning_tune_data.OnlineDataMixing"},
                                    mix_update_every=2)
    settings.update(options)
    return TextDataModule(dataset_managers={"train": {
        name: LocalDatasetManager(data_files=str(root / f"{name}.jsonl")) for name in ("low", "high")}},
        cache_dir=str(root / "cache"), **settings)


