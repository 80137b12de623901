"""Train the tiny example LM from Python (no YAML): ``Trainer.fit(model, datamodule=dm)``.

Three weighted train sources from ``examples/data`` (prose, arithmetic, a prompt/completion task
with the prompt masked out of the loss) are interleaved into one stream and packed; two named
val loaders (``lm``, ``arithmetic``) get their own metric groups; ``DatasetMetricsCallback``
reports what the model actually trained on, per source. Offline, well under a minute on a CPU:

    python examples/train_python_api.py
    python examples/train_python_api.py --max-steps 100 --packing concat --num-workers 2
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torchmetrics
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.loggers import CSVLogger

from lightning_tune_data import DatasetMetricsCallback, LocalDatasetManager, MetricSpec, TextDataModule
from lightning_tune_data.models import TinyCausalLM

DATA = Path(__file__).resolve().parent / "data"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-steps", type=int, default=40, help="optimizer steps to train")
    parser.add_argument("--batch-size", type=int, default=8, help="rows (packs) per batch")
    parser.add_argument("--max-seq-len", type=int, default=128, help="tokens per row")
    parser.add_argument("--packing", choices=["none", "greedy", "best_fit", "concat"], default="best_fit")
    parser.add_argument("--num-workers", type=int, default=0, help="dataloader workers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output-dir", type=Path, default=Path("runs/python_api"),
                        help="cache and CSV logs go here")
    return parser.parse_args()


def build_datamodule(args: argparse.Namespace) -> TextDataModule:
    """Managers are plain Python objects; the dict keys are the dataloader / metric names."""
    return TextDataModule(
        dataset_managers={
            "train": {
                "prose": LocalDatasetManager(data_files=str(DATA / "prose_train.jsonl"), weight=0.6),
                "arithmetic": LocalDatasetManager(data_files=str(DATA / "arithmetic_train.jsonl"), weight=0.3),
                "reverse": LocalDatasetManager(
                    data_files=str(DATA / "reverse_train.csv"),
                    ds_type="csv",
                    weight=0.1,
                    preprocess_function="lightning_tune_data.preprocess.tokenize_prompt_completion",
                ),
            },
            "val": {
                "lm": LocalDatasetManager(data_files=str(DATA / "prose_val.jsonl")),
                "arithmetic": LocalDatasetManager(data_files=str(DATA / "arithmetic_val.jsonl")),
            },
        },
        max_seq_len=args.max_seq_len,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        seed=args.seed,
        cache_dir=str(args.output_dir / "cache"),
        packing=None if args.packing == "none" else args.packing,
    )


def loss_metric() -> MetricSpec:
    """Token-weighted mean loss: ``MeanMetric.update(loss, weight=num_tokens)``."""
    return MetricSpec(torchmetrics.MeanMetric(), ["loss", "num_tokens"])


def build_model(datamodule: TextDataModule) -> TinyCausalLM:
    train_name = datamodule.dataloader_names["train"][0]  # "interleaved": several train sources, one stream
    reported_metrics = {
        "train": {train_name: {"loss": loss_metric()}},
        "val": {
            "lm": {
                "loss": loss_metric(),
                "perplexity": MetricSpec(torchmetrics.text.Perplexity(ignore_index=-100), ["logits", "labels"]),
            },
            "arithmetic": {"loss": loss_metric()},
        },
    }
    return TinyCausalLM(vocab_size=datamodule.vocab_size, max_seq_len=datamodule.max_seq_len, d_model=64,
                        n_layers=2, n_heads=4, reported_metrics=reported_metrics)


def main() -> None:
    args = parse_args()
    seed_everything(args.seed)
    datamodule = build_datamodule(args)
    model = build_model(datamodule)
    data_metrics = DatasetMetricsCallback(log_every_n_steps=10)
    trainer = Trainer(
        accelerator="cpu",
        max_steps=args.max_steps,
        val_check_interval=args.max_steps,  # validate once, at the end
        check_val_every_n_epoch=None,
        limit_val_batches=5,
        log_every_n_steps=10,
        callbacks=[data_metrics],
        default_root_dir=args.output_dir,
        logger=CSVLogger(args.output_dir, name="logs"),
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    trainer.fit(model, datamodule=datamodule)

    print(f"\ndataloader names: {datamodule.dataloader_names}")
    print("model metrics:", {k: round(float(v), 4) for k, v in sorted(trainer.callback_metrics.items())
                              if not k.startswith("dataset/")})
    print("per-source data metrics (get_metrics()):")
    print(json.dumps(data_metrics.get_metrics(), indent=2, default=str))


if __name__ == "__main__":
    main()
