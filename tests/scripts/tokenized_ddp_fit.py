"""One DDP fit (2 CPU ranks, gloo) on a Megatron corpus read in place mixed with a text source;
each rank records the documents of every batch its model trained on.

Usage: python tokenized_ddp_fit.py CORPUS_DIR RUN_DIR MAX_STEPS [URL ENDPOINT]
``CORPUS_DIR`` holds ``megatron/`` (.bin/.idx pairs) and ``a.jsonl``. With ``URL`` (the pairs on
the S3 stand-in at ``ENDPOINT``), the corpus is read from there by 2 KB byte ranges under a
16 KB node ``cache_budget`` (8 KB its share: less than the corpus). Each rank writes
RUN_DIR/rank<r>.json: per batch, ``[source, tokens]`` of every row (no packing: a row is one
document), and whether the corpus was read by ranges.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from ddp_common import ddp_trainer, finish, write_rank_json  # noqa: E402
from lightning.pytorch import Callback, seed_everything  # noqa: E402

from lightning_tune_data import LocalDatasetManager, TextDataModule, TokenizedDatasetManager  # noqa: E402
from lightning_tune_data.formats import ranged  # noqa: E402
from lightning_tune_data.models import TinyCausalLM  # noqa: E402


class Recorder(Callback):
    def __init__(self) -> None:
        self.batches: list[list] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        rows = []
        for row, (ids, mask) in enumerate(zip(batch["input_ids"].tolist(), batch["attention_mask"].tolist())):
            source = batch["provenance"]["source"][batch["provenance"]["row"].index(row)]
            rows.append([source, [token for token, keep in zip(ids, mask) if keep]])
        self.batches.append(rows)


def main() -> None:
    corpus, run_dir, max_steps = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    seed_everything(0)
    web, options = TokenizedDatasetManager(str(corpus / "megatron"), weight=0.6), {}
    if len(sys.argv) > 4:
        ranged.RANGE_BYTES = 2048
        storage = {"endpoint_url": sys.argv[5], "key": "testing", "secret": "testing"}
        web = TokenizedDatasetManager(sys.argv[4], weight=0.6, storage_options=storage)
        options = {"cache_budget": 16384}
    datamodule = TextDataModule(
        dataset_managers={"train": {"web": web,
                                    "text": LocalDatasetManager(data_files=str(corpus / "a.jsonl"), weight=0.4)}},
        max_seq_len=64, batch_size=4, seed=7, cache_dir=str(corpus / "cache"), num_workers=1, **options,
    )
    recorder = Recorder()
    trainer = ddp_trainer(max_steps=max_steps, callbacks=[recorder], limit_val_batches=0, default_root_dir=run_dir)
    model = TinyCausalLM(vocab_size=1024, max_seq_len=64, d_model=16, n_layers=1, n_heads=2)
    trainer.fit(model, datamodule=datamodule)
    write_rank_json(run_dir, trainer, {"batches": recorder.batches, "global_step": trainer.global_step,
                                          "ranged": type(datamodule.dataset("train", "web")).__name__ == "RangedCorpus"})
    finish()


if __name__ == "__main__":
    main()
