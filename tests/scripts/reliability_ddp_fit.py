"""DDP fits (2 CPU ranks, gloo) for the reliability tests; Lightning re-runs this script for rank 1.

Usage:
  python reliability_ddp_fit.py uneven CORPUS RUN_DIR
      A filter keeps every row of rank 0's shards but only 1 in 5 of rank 1's; 12 steps, then one
      validation over a val file of 13 rows (not divisible by 2 ranks). Each rank writes
      RUN_DIR/rank<r>.json: its train batches (texts, epochs), its global step and the logged
      val metrics.
  python reliability_ddp_fit.py uneven_finite CORPUS RUN_DIR
      The same data and filter with multidataset_stopping_strategy="first_exhausted" (one pass,
      max_epochs=1): rank 1's data ends first; no validation.
  python reliability_ddp_fit.py preempt CORPUS RUN_DIR MAX_STEPS SLEEP_S [CKPT]
      Two weighted sources, best_fit packing, 2 workers per rank, a checkpoint every 2 steps and
      SLEEP_S seconds per step (so a test can SIGKILL the run mid-way). Each rank appends the
      input_ids of every batch it trains on to RUN_DIR/rank<r>.jsonl as it goes. With CKPT the
      run resumes from it, loading the checkpoint with weights_only=True.
"""

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torchmetrics  # noqa: E402
from ddp_common import ddp_trainer, finish, tiny_model, two_source_datamodule, write_rank_json  # noqa: E402
from lightning.pytorch import Callback, seed_everything  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from reliability_fns import CountingLM, text_of  # noqa: E402

from lightning_tune_data import DatasetMetricsCallback, LocalDatasetManager, TextDataModule  # noqa: E402
from lightning_tune_data.models.harness import MetricSpec  # noqa: E402


class Recorder(Callback):
    """Keeps (and with ``path``, appends as JSON lines) what each train batch held."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self.batches: list[dict] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        record = {"step": trainer.global_step, "input_ids": batch["input_ids"].tolist(),
                  "texts": [text_of({"input_ids": row[row != 258]}) for row in batch["input_ids"]],
                  "epochs": [int(e) for e in batch["provenance"]["epoch"]]}
        self.batches.append(record)
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(record) + "\n")


class Sleeper(Callback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        time.sleep(self.seconds)


def uneven(corpus: Path, run_dir: Path, finite: bool) -> None:
    datamodule = TextDataModule(
        dataset_managers={
            "train": {"mixed": LocalDatasetManager(data_files=str(corpus / "train.jsonl"), shuffle=False,
                                                   filter_fn="reliability_fns.keep_marked")},
            "val": {"heldout": LocalDatasetManager(data_files=str(corpus / "val.jsonl"))},
        },
        max_seq_len=64, batch_size=4, eval_batch_size=3, num_workers=2, seed=3, cache_dir=str(corpus / "cache"),
        multidataset_stopping_strategy="first_exhausted" if finite else "infinite",
    )
    metrics = {
        "train": {"mixed": {"loss": MetricSpec(torchmetrics.MeanMetric(), ["loss", "num_tokens"])}},
        "val": {"heldout": {"tokens": MetricSpec(torchmetrics.SumMetric(), ["num_tokens"]),
                            "docs": MetricSpec(torchmetrics.SumMetric(), ["num_docs"])}},
    }
    model = tiny_model(datamodule, cls=CountingLM, reported_metrics=metrics)
    recorder = Recorder()
    if finite:
        trainer = ddp_trainer(max_steps=1000, max_epochs=1, limit_val_batches=0, enable_checkpointing=False,
                                 callbacks=[recorder])
    else:
        trainer = ddp_trainer(max_steps=12, val_check_interval=12, check_val_every_n_epoch=None,
                                 num_sanity_val_steps=0, enable_checkpointing=False, callbacks=[recorder])
    trainer.fit(model, datamodule=datamodule)
    write_rank_json(run_dir, trainer, {
        "global_step": trainer.global_step,
        "batches": recorder.batches,
        "val": {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val/")},
    })


def preempt(corpus: Path, run_dir: Path, max_steps: int, sleep_s: float, ckpt_path: str | None) -> None:
    datamodule = two_source_datamodule(corpus, num_workers=2, packing="best_fit")
    model = tiny_model(datamodule)
    run_dir.mkdir(parents=True, exist_ok=True)
    callbacks = [
        Recorder(run_dir / f"rank{int(os.environ.get('LOCAL_RANK', 0))}.jsonl"),
        DatasetMetricsCallback(log_every_n_steps=2),
        ModelCheckpoint(dirpath=run_dir / "ckpt", every_n_train_steps=2, save_top_k=-1),
        Sleeper(sleep_s),
    ]
    trainer = ddp_trainer(max_steps=max_steps, limit_val_batches=0, callbacks=callbacks)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True if ckpt_path else None)


def main() -> None:
    seed_everything(0)
    mode, corpus, run_dir = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
    if mode in ("uneven", "uneven_finite"):
        uneven(corpus, run_dir, finite=mode == "uneven_finite")
    else:
        ckpt = sys.argv[6] if len(sys.argv) > 6 else None
        preempt(corpus, run_dir, int(sys.argv[4]), float(sys.argv[5]), ckpt)
    finish()


if __name__ == "__main__":
    main()
