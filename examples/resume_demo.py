"""Exact resume, demonstrated: the batches after a resume are the batches the run would have seen.

1. Train to step 20 with a checkpoint every 10 steps, recording every batch the model trains on.
2. Start a new Trainer from the step-10 checkpoint and train to step 20, recording again.
3. Compare steps 10..19 of both runs tensor by tensor; exit with status 1 if any differs.

Shuffled, weighted interleaving of three sources, best-fit packing and two dataloader workers:
the hard case (Lightning prefetches one batch ahead and the packer holds a partial buffer).

    python examples/resume_demo.py
    python examples/resume_demo.py --packing concat --num-workers 0

Each invocation starts its runs in fresh folders under ``--output-dir``
(``<packing>-workers<N>/full`` and ``.../resumed``) and resumes from the checkpoint file the
checkpoint callback wrote in that fresh folder, so repeated or varied invocations never pick up an
older run's checkpoint.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_tune_data import DatasetMetricsCallback, LocalDatasetManager, TextDataModule
from lightning_tune_data.models import TinyCausalLM

DATA = Path(__file__).resolve().parent / "data"
CHECKPOINT_EVERY = 10
FINAL_STEP = 20


class BatchRecorder(Callback):
    """Keeps a copy of the tensors of every batch the model trains on, keyed by global step."""

    def __init__(self) -> None:
        self.batches: dict[int, dict[str, torch.Tensor]] = {}
        self.sources: dict[int, list[str]] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        step = trainer.global_step
        self.batches[step] = {k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)}
        self.sources[step] = list(batch["provenance"]["source"])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packing", choices=["none", "greedy", "best_fit", "concat"], default="best_fit")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-seq-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", type=Path, default=Path("runs/resume_demo"))
    return parser.parse_args()


def build_datamodule(args: argparse.Namespace) -> TextDataModule:
    return TextDataModule(
        dataset_managers={"train": {
            "prose": LocalDatasetManager(data_files=str(DATA / "prose_train.jsonl"), weight=0.6),
            "arithmetic": LocalDatasetManager(data_files=str(DATA / "arithmetic_train.jsonl"), weight=0.3),
            "reverse": LocalDatasetManager(
                data_files=str(DATA / "reverse_train.csv"), ds_type="csv", weight=0.1,
                preprocess_function="lightning_tune_data.preprocess.tokenize_prompt_completion",
            ),
        }},
        max_seq_len=args.max_seq_len,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        seed=args.seed,
        cache_dir=str(args.output_dir / "cache"),
        packing=None if args.packing == "none" else args.packing,
    )


def train(args: argparse.Namespace, run_dir: Path, ckpt_path: str | None = None) -> tuple[BatchRecorder, Path | None]:
    """One real ``Trainer.fit`` to ``FINAL_STEP`` in a fresh ``run_dir``; from ``ckpt_path`` when given.

    Returns the recorder and the checkpoint written at step ``CHECKPOINT_EVERY`` (as the checkpoint
    callback reports it).
    """
    shutil.rmtree(run_dir, ignore_errors=True)
    seed_everything(args.seed)
    datamodule = build_datamodule(args)
    model = TinyCausalLM(vocab_size=datamodule.vocab_size, max_seq_len=args.max_seq_len, d_model=32, n_layers=1,
                         n_heads=2)
    recorder = BatchRecorder()
    checkpoints = ModelCheckpoint(dirpath=run_dir / "checkpoints", every_n_train_steps=CHECKPOINT_EVERY,
                                  save_top_k=-1)
    trainer = Trainer(accelerator="cpu", max_steps=FINAL_STEP, limit_val_batches=0, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, default_root_dir=run_dir,
                      callbacks=[recorder, checkpoints, DatasetMetricsCallback(log_every_n_steps=CHECKPOINT_EVERY)])
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    written = sorted(Path(checkpoints.dirpath).glob(f"*step={CHECKPOINT_EVERY}*.ckpt"))  # run_dir is fresh
    return recorder, (written[0] if len(written) == 1 else None)


def main() -> int:
    args = parse_args()
    print(f"1) uninterrupted run to step {FINAL_STEP} (checkpoint every {CHECKPOINT_EVERY} steps)")
    run_root = args.output_dir / f"{args.packing}-workers{args.num_workers}"
    full, checkpoint = train(args, run_root / "full")
    if checkpoint is None:
        print(f"FAIL: the first run wrote no checkpoint at step {CHECKPOINT_EVERY}")
        return 1
    print(f"2) resume from {checkpoint} to step {FINAL_STEP}")
    resumed, _ = train(args, run_root / "resumed", ckpt_path=str(checkpoint))

    expected_steps = list(range(CHECKPOINT_EVERY, FINAL_STEP))
    if sorted(resumed.batches) != expected_steps:
        print(f"FAIL: the resumed run trained on steps {sorted(resumed.batches)}, expected {expected_steps}")
        return 1
    mismatches = []
    for step in expected_steps:
        want, got = full.batches[step], resumed.batches[step]
        differing = [key for key in want if key not in got or not torch.equal(want[key], got[key])]
        if differing or want.keys() != got.keys():
            mismatches.append((step, differing))
        status = "identical" if not differing else f"DIFFERENT ({', '.join(differing)})"
        rows, width = got["input_ids"].shape
        print(f"   step {step}: {rows}x{width} batch, sources {sorted(set(resumed.sources[step]))}: {status}")
    if mismatches:
        print(f"FAIL: {len(mismatches)} of {len(expected_steps)} batches after the resume differ: {mismatches}")
        return 1
    print(f"3) OK: all {len(expected_steps)} batches after the resume are bitwise identical to the uninterrupted run "
          f"(packing={args.packing}, num_workers={args.num_workers})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
