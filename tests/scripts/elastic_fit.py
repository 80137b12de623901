"""One fit that records which documents every train batch carried (for elastic-resume tests).

Usage (DDP, Lightning re-runs this script for rank 1):
    python elastic_fit.py CORPUS RUN_DIR MAX_STEPS DEVICES NUM_WORKERS BATCH_SIZE PACKING [CKPT_PATH]
Writes RUN_DIR/rank<r>.json: {"documents": [[source, epoch, name], ...] per batch, "batches": input_ids per
batch, "global_step": ...}. A document's name is the text before its first ':' (documents are
"A12: words ..."), so the same document is recognised however it was packed or truncated.
The test module imports ``fit`` to run single-process fits in-process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_tune_data import DatasetMetricsCallback, LocalDatasetManager, TextDataModule
from lightning_tune_data.models import TinyCausalLM

BOS, PAD = 256, 258
MAX_SEQ_LEN = 64
CHECKPOINT_EVERY = 5


def _name(tokens: list[int]) -> str:
    text = bytes(t for t in tokens if t < 256).decode("utf-8", errors="replace")
    return text.split(":", 1)[0]


def documents_of(batch: dict) -> list[list]:
    """[source, epoch, name] of every document that starts in this batch (continuations are skipped)."""
    provenance = batch["provenance"]
    ids = batch["input_ids"].tolist()
    out = []
    if "document_ids" in batch:
        doc_ids = batch["document_ids"].tolist()
        entry = 0
        for row, (row_ids, row_docs) in enumerate(zip(ids, doc_ids)):
            for doc in sorted({d for d in row_docs if d >= 0}):
                tokens = [t for t, d in zip(row_ids, row_docs) if d == doc]
                assert provenance["row"][entry] == row
                if provenance["new_document"][entry]:
                    out.append([provenance["source"][entry], provenance["epoch"][entry], _name(tokens)])
                entry += 1
        return out
    for row, row_ids in enumerate(ids):
        out.append([provenance["source"][row], provenance["epoch"][row], _name([t for t in row_ids if t != PAD])])
    return out


class DocumentRecorder(Callback):
    def __init__(self) -> None:
        self.documents: list[list[list]] = []
        self.batches: list[list[list[int]]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        self.documents.append(documents_of(batch))
        self.batches.append(batch["input_ids"].tolist())


def fit(corpus: Path, run_dir: Path, max_steps: int, devices: int = 1, num_workers: int = 0, batch_size: int = 4,
        packing: str | None = None, ckpt_path: str | None = None) -> dict:
    seed_everything(0)
    datamodule = TextDataModule(
        dataset_managers={
            "train": {
                "a": LocalDatasetManager(data_files=str(corpus / "a.jsonl"), weight=0.6),
                "b": LocalDatasetManager(data_files=str(corpus / "b.jsonl"), weight=0.4),
            }
        },
        max_seq_len=MAX_SEQ_LEN,
        batch_size=batch_size,
        num_workers=num_workers,
        seed=7,
        packing=packing,
        packing_buffer_size=4,
        cache_dir=str(corpus / "cache"),
    )
    recorder = DocumentRecorder()
    metrics = DatasetMetricsCallback(log_every_n_steps=CHECKPOINT_EVERY)
    trainer = Trainer(
        accelerator="cpu",
        strategy="ddp" if devices > 1 else "auto",
        devices=devices,
        max_steps=max_steps,
        callbacks=[recorder, metrics, ModelCheckpoint(dirpath=run_dir / "ckpt", every_n_train_steps=CHECKPOINT_EVERY, save_top_k=-1)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=run_dir,
    )
    model = TinyCausalLM(vocab_size=datamodule.vocab_size, max_seq_len=MAX_SEQ_LEN, d_model=16, n_layers=1, n_heads=2)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    samples = {name: entry["metrics"]["samples_seen"] for name, entry in metrics.get_metrics().items()}
    result = {"documents": recorder.documents, "batches": recorder.batches, "global_step": trainer.global_step,
              "samples_seen": samples}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(result))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()
    return result


if __name__ == "__main__":
    corpus, run_dir, max_steps, devices, num_workers, batch_size, packing = sys.argv[1:8]
    fit(Path(corpus), Path(run_dir), int(max_steps), int(devices), int(num_workers), int(batch_size),
        None if packing == "none" else packing, sys.argv[8] if len(sys.argv) > 8 else None)
