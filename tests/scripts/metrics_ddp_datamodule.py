"""One 2-rank DDP fit (gloo, CPU) over a real TextDataModule with DatasetMetricsCallback.

Usage: python metrics_ddp_datamodule.py CORPUS_DIR RUN_DIR MAX_STEPS NUM_WORKERS PACKING LOG_EVERY WINDOW

Lightning's subprocess launcher re-runs this script for rank 1. Each rank writes RUN_DIR/rank<r>.json
with every batch its model trained on (tensors as lists, plus provenance) and the callback's final
``get_metrics()``; rank 0's CSVLogger writes RUN_DIR/csv/version_0/metrics.csv.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from ddp_common import ddp_trainer, finish, tiny_model, two_source_datamodule, write_rank_json  # noqa: E402
from lightning.pytorch import Callback, seed_everything  # noqa: E402
from lightning.pytorch.loggers import CSVLogger  # noqa: E402

from lightning_tune_data import DatasetMetricsCallback  # noqa: E402

RECORDED_KEYS = ("input_ids", "labels", "attention_mask", "seq_lens")


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
    datamodule = two_source_datamodule(corpus, int(num_workers), packing)
    recorder = Recorder()
    metrics = DatasetMetricsCallback(log_every_n_steps=int(log_every), seq_len_stat_window_size=int(window))
    trainer = ddp_trainer(
        max_steps=int(max_steps),
        callbacks=[recorder, metrics],
        logger=CSVLogger(save_dir=run_dir, name="csv", version=0),
        log_every_n_steps=1000,
        enable_checkpointing=False,
        limit_val_batches=0,
        default_root_dir=run_dir,
    )
    trainer.fit(tiny_model(datamodule), datamodule=datamodule)
    write_rank_json(run_dir, trainer, {
        "rank": trainer.global_rank,
        "global_step": trainer.global_step,
        "batches": recorder.batches,
        "get_metrics": {name: entry["metrics"] for name, entry in metrics.get_metrics().items()},
    })
    finish()


if __name__ == "__main__":
    main()
