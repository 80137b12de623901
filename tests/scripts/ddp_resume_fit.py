"""One DDP fit (2 CPU ranks, gloo) that records each rank's train batches to JSON.

Usage: python ddp_resume_fit.py CORPUS_DIR RUN_DIR MAX_STEPS NUM_WORKERS PACKING [CKPT_PATH]
Lightning's subprocess launcher re-runs this script for rank 1. Each rank writes
RUN_DIR/rank<r>.json with the input_ids of every batch its model trained on.
"""

import json
import sys
from pathlib import Path

import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_tune_data import LocalDatasetManager, TextDataModule
from lightning_tune_data.models import TinyCausalLM


def documents_of(batch) -> list:
    """(source, epoch, tokens) of every document in the batch, from rows split at BOS."""
    provenance = batch["provenance"]
    out = []
    for row_index, row in enumerate(batch["input_ids"].tolist()):
        starts = [i for i, token in enumerate(row) if token == 256]  # ByteTokenizer BOS
        pieces = [row[a:b] for a, b in zip(starts, starts[1:] + [len(row)])]
        entries = [i for i, r in enumerate(provenance["row"]) if r == row_index]
        for entry, piece in zip(entries, pieces):
            tokens = [t for t in piece if t != 258]  # drop padding
            out.append([provenance["source"][entry], provenance["epoch"][entry], tokens])
    return out


class Recorder(Callback):
    def __init__(self) -> None:
        self.batches: list[list[list[int]]] = []
        self.sources: list[list[str]] = []
        self.documents: list[list] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.append(batch["input_ids"].tolist())
        self.sources.append(list(batch["provenance"]["source"]))
        self.documents.append(documents_of(batch))


def main() -> None:
    corpus, run_dir, max_steps, num_workers, packing = sys.argv[1:6]
    ckpt_path = sys.argv[6] if len(sys.argv) > 6 else None
    corpus, run_dir = Path(corpus), Path(run_dir)
    seed_everything(0)
    datamodule = TextDataModule(
        dataset_managers={
            "train": {
                "a": LocalDatasetManager(data_files=str(corpus / "a.jsonl"), weight=0.7),
                "b": LocalDatasetManager(data_files=str(corpus / "b.jsonl"), weight=0.3),
            }
        },
        max_seq_len=64,
        batch_size=4,
        num_workers=int(num_workers),
        seed=7,
        packing=None if packing == "none" else packing,
        cache_dir=str(corpus / "cache"),
    )
    recorder = Recorder()
    trainer = Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=2,
        max_steps=int(max_steps),
        callbacks=[recorder, ModelCheckpoint(dirpath=run_dir / "ckpt", every_n_train_steps=4, save_top_k=-1)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=run_dir,
    )
    model = TinyCausalLM(vocab_size=datamodule.vocab_size, max_seq_len=64, d_model=16, n_layers=1, n_heads=2)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    out = {"batches": recorder.batches, "sources": recorder.sources, "documents": recorder.documents, "global_step": trainer.global_step}
    (run_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(out))
    torch.distributed.barrier() if torch.distributed.is_initialized() else None


if __name__ == "__main__":
    main()
