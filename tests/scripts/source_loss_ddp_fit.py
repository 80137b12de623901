"""A 2-rank DDP fit (gloo, CPU) of TinyCausalLM on two packed sources, logging per-source losses.

Usage: python source_loss_ddp_fit.py CORPUS_DIR RUN_DIR MAX_STEPS

Each rank writes RUN_DIR/rank<r>.json: per step, the loss and the source of every label token it
trained on (sources read from ``seq_lens`` and the provenance order, not from ``document_ids``);
rank 0's CSVLogger writes RUN_DIR/csv/version_0/metrics.csv.
"""

import json
import sys
from pathlib import Path

import torch
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.loggers import CSVLogger

from lightning_tune_data import LocalDatasetManager, TextDataModule
from lightning_tune_data.models import TinyCausalLM


class RecordingLM(TinyCausalLM):
    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.recorded: list[dict] = []

    def step_outputs(self, batch):
        outputs = super().step_outputs(batch)
        if self.training:
            losses, sources = [], []
            documents = iter(batch["provenance"]["source"])
            for row in range(batch["input_ids"].shape[0]):
                offset = 0
                for length in (int(n) for n in batch["seq_lens"][row] if n > 0):
                    source = next(documents)
                    for position in range(offset, offset + length):
                        if int(batch["labels"][row, position]) != -100:
                            losses.append(float(outputs["token_loss"][row, position]))
                            sources.append(source)
                    offset += length
            self.recorded.append({"loss": losses, "source": sources})
        return outputs


def main() -> None:
    corpus, run_dir, max_steps = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    seed_everything(0)
    datamodule = TextDataModule(
        dataset_managers={"train": {"a": LocalDatasetManager(data_files=str(corpus / "a.jsonl"), weight=0.5),
                                    "b": LocalDatasetManager(data_files=str(corpus / "b.jsonl"), weight=0.5)}},
        max_seq_len=64, batch_size=3, seed=2, packing="best_fit", cache_dir=str(corpus / "cache"),
    )
    model = RecordingLM(vocab_size=datamodule.vocab_size, max_seq_len=64, d_model=16, n_layers=1, n_heads=2)
    trainer = Trainer(accelerator="cpu", strategy="ddp", devices=2, max_steps=max_steps, log_every_n_steps=1,
                      logger=CSVLogger(save_dir=run_dir, name="csv", version=0), limit_val_batches=0,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=run_dir)
    trainer.fit(model, datamodule=datamodule)
    (run_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps({"steps": model.recorded}))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


if __name__ == "__main__":
    main()
