"""Shared setup of the 2-rank DDP test scripts (gloo on CPU; Lightning re-runs each script for rank 1).

* :func:`two_source_datamodule`: sources ``a`` (weight 0.7) and ``b`` (0.3) from ``CORPUS/{a,b}.jsonl``,
  ``max_seq_len=64``, ``batch_size=4``, ``seed=7``, cache under ``CORPUS/cache``.
* :func:`ddp_trainer`: a 2-process ``strategy="ddp"`` CPU Trainer without logger, progress bar or summary.
* :func:`tiny_model`: a one-layer ``TinyCausalLM`` sized to the datamodule.
* :func:`write_rank_json` / :func:`finish`: each rank's JSON report, then a barrier so no rank exits early.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Trainer

from lightning_tune_data import LocalDatasetManager, TextDataModule
from lightning_tune_data.models import TinyCausalLM

MAX_SEQ_LEN = 64


def two_source_datamodule(corpus: Path, num_workers: int, packing: str | None, **options: Any) -> TextDataModule:
    """The weighted two-source train mix most DDP scripts use (``packing`` ``"none"`` means ``None``)."""
    settings: dict[str, Any] = {"max_seq_len": MAX_SEQ_LEN, "batch_size": 4, "seed": 7,
                                "cache_dir": str(corpus / "cache"), **options}
    return TextDataModule(
        dataset_managers={"train": {
            "a": LocalDatasetManager(data_files=str(corpus / "a.jsonl"), weight=0.7),
            "b": LocalDatasetManager(data_files=str(corpus / "b.jsonl"), weight=0.3),
        }},
        num_workers=int(num_workers),
        packing=None if packing in (None, "none") else packing,
        **settings,
    )


def ddp_trainer(**kwargs: Any) -> Trainer:
    """Two gloo CPU processes; no logger, progress bar or model summary unless ``kwargs`` say so."""
    settings = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False, **kwargs}
    return Trainer(accelerator="cpu", strategy="ddp", devices=2, **settings)


def tiny_model(datamodule: TextDataModule, cls: type = TinyCausalLM, **kwargs: Any) -> TinyCausalLM:
    return cls(vocab_size=datamodule.vocab_size, max_seq_len=datamodule.max_seq_len, d_model=16, n_layers=1,
               n_heads=2, **kwargs)


def write_rank_json(run_dir: Path, trainer: Trainer, report: dict[str, Any]) -> None:
    """``RUN_DIR/rank<r>.json`` with this rank's report."""
    (Path(run_dir) / f"rank{trainer.global_rank}.json").write_text(json.dumps(report))


def finish() -> None:
    """Wait for every rank (a rank that exits first would tear the process group down)."""
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
