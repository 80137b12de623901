"""One process of a 2-node CPU job (1 process per node, gloo) on a shared cache directory.

Usage: python node_fit.py CORPUS CACHE_DIR OUT_JSON PREPARE_PER_NODE(0|1)
The test launches it twice with NODE_RANK=0/1, LOCAL_RANK=0, WORLD_SIZE=2 and a shared
MASTER_ADDR/MASTER_PORT, as a cluster launcher would on two machines. Writes the cache log lines
this process emitted and the cache directories its train sources were read from.
"""

import json
import logging
import sys
from pathlib import Path

import torch
from lightning.pytorch import Trainer, seed_everything

from lightning_tune_data import LocalDatasetManager, TextDataModule
from lightning_tune_data.models import TinyCausalLM


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def main() -> None:
    corpus, cache_dir, out, per_node = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), sys.argv[4] == "1"
    lines = Lines()
    cache_logger = logging.getLogger("lightning_tune_data.cache.store")
    cache_logger.addHandler(lines)
    cache_logger.setLevel(logging.INFO)
    seed_everything(0)
    datamodule = TextDataModule(
        {"train": {"a": LocalDatasetManager(data_files=str(corpus / "a.jsonl"))}},
        max_seq_len=64, batch_size=2, cache_dir=cache_dir, prepare_data_per_node=per_node,
    )
    trainer = Trainer(accelerator="cpu", strategy="ddp", devices=1, num_nodes=2, max_steps=2, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      limit_val_batches=0)
    model = TinyCausalLM(vocab_size=datamodule.vocab_size, max_seq_len=64, d_model=16, n_layers=1, n_heads=2)
    trainer.fit(model, datamodule=datamodule)
    data = datamodule._datasets["train"]["a"]
    files = sorted({f["filename"] for f in data.cache_files})
    out.write_text(json.dumps({"node_rank": trainer.node_rank, "global_rank": trainer.global_rank,
                               "log": lines.lines, "cache_files": files, "steps": trainer.global_step}))
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


if __name__ == "__main__":
    main()
