"""One DDP fit (2 CPU ranks, gloo) that records each rank's train batches to JSON.

Usage: python ddp_resume_fit.py CORPUS_DIR RUN_DIR MAX_STEPS NUM_WORKERS PACKING [CKPT_PATH]
Lightning's subprocess launcher re-runs this script for rank 1. Each rank writes
RUN_DIR/rank<r>.json with the input_ids of every batch its model trained on.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from ddp_common import ddp_trainer, finish, tiny_model, two_source_datamodule, write_rank_json  # noqa: E402
from lightning.pytorch import Callback, seed_everything  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402


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
    datamodule = two_source_datamodule(corpus, int(num_workers), packing)
    recorder = Recorder()
    trainer = ddp_trainer(
        max_steps=int(max_steps),
        callbacks=[recorder, ModelCheckpoint(dirpath=run_dir / "ckpt", every_n_train_steps=4, save_top_k=-1)],
        limit_val_batches=0,
        default_root_dir=run_dir,
    )
    trainer.fit(tiny_model(datamodule), datamodule=datamodule, ckpt_path=ckpt_path)
    write_rank_json(run_dir, trainer, {"batches": recorder.batches, "sources": recorder.sources,
                                       "documents": recorder.documents, "global_step": trainer.global_step})
    finish()


if __name__ == "__main__":
    main()
