"""One DDP fit (2 CPU ranks x 2 workers, gloo) with the online mixing controller.

Usage: python online_mixing_ddp_fit.py CORPUS_DIR RUN_DIR MAX_STEPS
Each rank writes RUN_DIR/rank<r>.json: the controller's weight history, and after every batch the
weights each of its workers' mixtures drew by (read from the saved data state), and the sources
of its batches.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1]))

from ddp_common import ddp_trainer, finish, write_rank_json  # noqa: E402
from lightning.pytorch import Callback, seed_everything  # noqa: E402
from online_models import LevelModel, online_datamodule  # noqa: E402

from lightning_tune_data.loading.checkpoint import old_shard_states  # noqa: E402


class MixtureWeights(Callback):
    """After every trained batch: the weights each worker of this rank drew its last documents by."""

    def __init__(self) -> None:
        self.weights: list = []
        self.sources: list = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.sources.append(list(batch["provenance"]["source"]))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        shards = old_shard_states(trainer.datamodule.state_dict())  # a collective: every rank calls it
        own = shards[trainer.global_rank * 2:(trainer.global_rank + 1) * 2]
        self.weights.append([shard["interleaved"]["weights"] for shard in own])


def main() -> None:
    corpus, run_dir, max_steps = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    seed_everything(0)
    datamodule = online_datamodule(corpus, mix_update_every=2)
    recorder = MixtureWeights()
    trainer = ddp_trainer(max_steps=max_steps, limit_val_batches=0, default_root_dir=run_dir, callbacks=[recorder],
                          enable_checkpointing=False)
    trainer.fit(LevelModel(), datamodule=datamodule)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_rank_json(run_dir, trainer, {"history": datamodule.mix_control.history, "mixture_weights": recorder.weights,
                                       "sources": recorder.sources})
    finish()


if __name__ == "__main__":
    main()
