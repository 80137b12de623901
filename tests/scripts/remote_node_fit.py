"""One node of a job that trains from a token store in S3 (a few steps of a real Trainer).

Usage: python remote_node_fit.py CONFIG_JSON OUT_PT
CONFIG_JSON is a fit config's ``data:`` section (``cache_dir: s3://...``, ``storage_options``, this
node's ``local_cache_dir``). The Trainer runs ``prepare_data`` (which downloads the store to this
node) and ``setup``; the batches the model trained on are saved to OUT_PT (``torch.save``), with
``{"steps", "batches"}``.
"""

import json
import sys
from pathlib import Path

import torch
from lightning.pytorch import Callback, Trainer, seed_everything

from lightning_tune_data.models import TinyCausalLM
from lightning_tune_data.report.batches import datamodule_from_config

STEPS = 3


class Batches(Callback):
    def __init__(self) -> None:
        self.batches: list[dict[str, torch.Tensor]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        self.batches.append({k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)})


def main() -> None:
    config, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    seed_everything(0)
    datamodule = datamodule_from_config(config)
    recorder = Batches()
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=STEPS, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                      callbacks=[recorder])
    model = TinyCausalLM(vocab_size=datamodule.vocab_size, max_seq_len=datamodule.max_seq_len, d_model=16,
                         n_layers=1, n_heads=2)
    trainer.fit(model, datamodule=datamodule)
    torch.save({"steps": trainer.global_step, "batches": recorder.batches}, out)


if __name__ == "__main__":
    main()
