"""One 2-rank DDP fit (gloo, CPU) over a real TextDataModule with DatasetMetricsCallback.

Usage: python metrics_ddp_datamodule.py CORPUS_DIR RUN_DIR MAX_STEPS NUM_WORKERS PACKING LOG_EVERY WINDOW

Lightning's subprocess launcher re-runs this script for rank 1. Each rank writes RUN_DIR/rank<r>.json
with every batch its model trained on (tensors as lists, plus provenance) and the callback's final
``get_metrics()``; rank 0's CSVLogger writes RUN_DIR/csv/version_0/metrics.csv.
"""

import json
import sys
from pathlib import Path

import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.loggers import CSVLogger

from lightning_tune_data import DatasetMetricsCallback, LocalDatasetManager, TextDataModule
from lightning_tune_data.models import TinyCausalLM

RECORDED_KEYS = ("input_ids", "attention_mask", "seq_lens")


class Recorder(Callback):
    def __init__(self) -> None:
        self.batches: list[dict] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        recorded = {key: batch[key].tolist() for key in RECORDED_KEYS if key in batch}
        recorded["provenance"] = {key: list(values) for key, values in batch["provenance"].items()}
        self.batches.append(recorded)


def main() -> None:
    corpus, run_dir, max_steps, num_workers, packing, log_every, window = sys.argv[1:8]
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
    metrics = DatasetMetricsCallback(log_every_n_steps=int(log_every), seq_len_stat_window_size=int(window))
    trainer = Trainer(
        accelerator="cpu",
        strategy="ddp",
        devices=2,
        max_steps=int(max_steps),
        callbacks=[recorder, metrics],
        logger=CSVLogger(save_dir=run_dir, name="csv", version=0),
        log_every_n_steps=1000,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=run_dir,
    )
    model = TinyCausalLM(vocab_size=datamodule.vocab_size, max_seq_len=64, d_model=16, n_layers=1, n_heads=2)
    trainer.fit(model, datamodule=datamodule)
    out = {
        "rank": trainer.global_rank,
        "global_step": trainer.global_step,
        "batches": recorder.batches,
        "get_metrics": {name: entry["metrics"] for name, entry in metrics.get_metrics().items()},
    }
    (run_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(out))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


if __name__ == "__main__":
    main()
