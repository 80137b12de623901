"""Two DDP ranks (gloo, CPU) of one node training from an S3 store through the node's shard cache.

Usage: python node_cache_ddp_fit.py CONFIG_JSON RUN_DIR MAX_STEPS
CONFIG_JSON is a fit config's ``data:`` section (``cache_dir: s3://...``, ``storage_options``, the
node's ``local_cache_dir`` and a ``cache_budget``). Lightning's launcher re-runs this script for
rank 1. Each rank writes RUN_DIR/rank<r>.json: its steps, its batches' sources, and its shard
cache's folder, budget and usage at the end.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from ddp_common import ddp_trainer, finish, tiny_model, write_rank_json  # noqa: E402
from lightning.pytorch import Callback, seed_everything  # noqa: E402

from lightning_tune_data.report.batches import datamodule_from_config  # noqa: E402


class Sources(Callback):
    def __init__(self) -> None:
        self.sources: list[list[str]] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        self.sources.append(list(batch["provenance"]["source"]))


def main() -> None:
    config, run_dir, max_steps = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2]), int(sys.argv[3])
    seed_everything(0)
    datamodule = datamodule_from_config(config)
    recorder = Sources()
    trainer = ddp_trainer(max_steps=max_steps, callbacks=[recorder], limit_val_batches=0, enable_checkpointing=False,
                          default_root_dir=run_dir)
    trainer.fit(tiny_model(datamodule), datamodule=datamodule)
    caches = {name: datamodule.dataset("train", name).cache for name in datamodule.dataset_managers["train"]}
    write_rank_json(run_dir, trainer, {
        "steps": trainer.global_step, "sources": recorder.sources,
        "caches": {name: {"folder": str(cache.folder), "budget": cache.budget, "usage": cache.node_usage()}
                   for name, cache in caches.items()},
    })
    finish()


if __name__ == "__main__":
    main()
