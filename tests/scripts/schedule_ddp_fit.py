"""One DDP fit (2 CPU ranks x 2 workers, gloo) over a linear mixture schedule, recording each rank's batches.

Usage: python schedule_ddp_fit.py CORPUS_DIR RUN_DIR MAX_STEPS PACKING MIX_BY [CKPT_PATH]
(``SCHEDULE_SWITCH_AT=N`` in the environment: all ``a`` until step N, all ``b`` from it, instead.)
Each rank writes RUN_DIR/rank<r>.json: the input_ids and provenance of every batch its model trained
on, and the schedule's target share of source ``a`` at every step.
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from ddp_common import ddp_trainer, finish, two_source_datamodule, write_rank_json  # noqa: E402
from lightning.pytorch import Callback, LightningModule, seed_everything  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402

LINEAR = {"unit": "steps", "interpolation": "linear", "points": [
    {"at": 0.0, "weights": {"a": 0.9, "b": 0.1}}, {"at": 1.0, "weights": {"a": 0.1, "b": 0.9}}]}


class Still(LightningModule):
    """One parameter at lr 0: the data is what the test looks at."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        return (self.w * batch["input_ids"].float().mean()) ** 2

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


class Recorder(Callback):
    def __init__(self) -> None:
        self.batches: list = []
        self.provenance: list = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches.append(batch["input_ids"].tolist())
        self.provenance.append({k: list(v) for k, v in batch["provenance"].items()})


def main() -> None:
    corpus, run_dir, max_steps, packing, mix_by = sys.argv[1:6]
    ckpt_path = sys.argv[6] if len(sys.argv) > 6 else None
    corpus, run_dir, max_steps = Path(corpus), Path(run_dir), int(max_steps)
    seed_everything(0)
    long = max_steps > 50
    switch = os.environ.get("SCHEDULE_SWITCH_AT")
    schedule = LINEAR if switch is None else {"unit": "steps", "interpolation": "step", "points": [
        {"at": 0, "weights": {"a": 1.0, "b": 0.0}}, {"at": int(switch), "weights": {"a": 0.0, "b": 1.0}}]}
    datamodule = two_source_datamodule(corpus, 2, packing, mix_schedule=schedule, mix_by=mix_by,
                                       **({"max_seq_len": 512, "batch_size": 16} if long else {}))
    recorder = Recorder()
    trainer = ddp_trainer(max_steps=max_steps, limit_val_batches=0, default_root_dir=run_dir, callbacks=[
        recorder, ModelCheckpoint(dirpath=run_dir / "ckpt", every_n_train_steps=5, save_top_k=-1)],
        enable_checkpointing=True)
    trainer.fit(Still(), datamodule=datamodule, ckpt_path=ckpt_path)
    targets = [datamodule.mixture.targets_at(step)["a"] for step in range(max_steps)]
    write_rank_json(run_dir, trainer, {"batches": recorder.batches, "provenance": recorder.provenance,
                                       "targets": targets})
    finish()


if __name__ == "__main__":
    main()
