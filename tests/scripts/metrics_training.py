"""Real Lightning training runs that feed ``DatasetMetricsCallback`` batches carrying provenance.

Imported by ``tests/metrics/test_callback.py`` for single-process runs, and run as a script for DDP::

    python tests/scripts/metrics_training.py OUT_DIR fit            # 2 gloo ranks, checkpoints every 2 steps
    python tests/scripts/metrics_training.py OUT_DIR resume CKPT    # 2 gloo ranks, resumes from CKPT

Lightning's subprocess launcher re-runs this file for rank 1. Each rank writes the provenance of the
batches its model trained on to ``OUT_DIR/<mode>_records_rank<R>.json``; rank 0 also writes
``OUT_DIR/<mode>_result.json`` with the path of the CSV metrics and checkpoints.
"""

from __future__ import annotations

import csv
import json
import os
import random
import statistics
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import IterableDataset, get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_tune_data.metrics import DatasetMetricsCallback

Batch = dict[str, Any]

#: Document lengths per source for rank 0; other ranks' lengths are shifted up (distinct windows).
DEFAULT_SOURCES: dict[str, tuple[int, int]] = {"books": (3, 12), "code": (1, 6), "web": (6, 20)}
DEFAULT_WEIGHTS: dict[str, float] = {"books": 2.0, "code": 1.0, "web": 1.0}


class ProvenanceBatches(IterableDataset):
    """Infinite stream of ready-made batches (use ``batch_size=None``) with a provenance side channel.

    Every (seed, rank, worker) triple gets its own deterministic documents. Packed batches hold several
    document pieces per row (the first piece of a row may continue a document, ``new_document=False``)
    and carry ``document_ids``; unpacked batches hold one document per row.

    Args:
        sources: Source name -> inclusive (min, max) document length on rank 0.
        rows: Rows per batch.
        seq_len: Positions per row.
        packed: Emit packed batches.
        seed: Base seed.
        rank: Global rank of the process that owns the loader.
        rank_length_shift: Added to every document length on rank ``r`` as ``r * rank_length_shift``.
        docs_per_epoch: Documents per pass over a source on one shard (drives ``epoch``).
    """

    def __init__(
        self,
        sources: dict[str, tuple[int, int]] | None = None,
        rows: int = 3,
        seq_len: int = 48,
        packed: bool = True,
        seed: int = 0,
        rank: int = 0,
        rank_length_shift: int = 0,
        docs_per_epoch: int = 7,
    ) -> None:
        self.sources = dict(sources or DEFAULT_SOURCES)
        self.rows, self.seq_len, self.packed = rows, seq_len, packed
        self.seed, self.rank, self.rank_length_shift = seed, rank, rank_length_shift
        self.docs_per_epoch = docs_per_epoch

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        worker = info.id if info is not None else 0
        rng = random.Random(self.seed * 1_000_003 + self.rank * 1_009 + worker)
        docs_started = dict.fromkeys(self.sources, 0)
        names = sorted(self.sources)
        shift = self.rank * self.rank_length_shift

        def new_doc() -> tuple[str, int, int]:
            name = rng.choice(names)
            lo, hi = self.sources[name]
            epoch = docs_started[name] // self.docs_per_epoch
            docs_started[name] += 1
            return name, epoch, min(self.seq_len, rng.randint(lo, hi) + shift)

        while True:
            input_ids = torch.zeros(self.rows, self.seq_len, dtype=torch.long)
            mask = torch.zeros(self.rows, self.seq_len, dtype=torch.long)
            doc_ids = torch.full((self.rows, self.seq_len), -1, dtype=torch.long)
            prov: dict[str, list] = {k: [] for k in ("source", "epoch", "tokens", "row", "new_document")}
            for row in range(self.rows):
                pos, doc_in_row = 0, 0
                while pos < self.seq_len:
                    name, epoch, length = new_doc()
                    continuation = self.packed and doc_in_row == 0 and rng.random() < 0.3
                    length = min(length, self.seq_len - pos)
                    input_ids[row, pos : pos + length] = rng.randint(1, 200)
                    mask[row, pos : pos + length] = 1
                    doc_ids[row, pos : pos + length] = doc_in_row
                    for key, value in zip(prov, (name, epoch, length, row, not continuation)):
                        prov[key].append(value)
                    pos += length
                    doc_in_row += 1
                    if not self.packed or rng.random() < 0.35:
                        break
            batch: Batch = {"input_ids": input_ids, "attention_mask": mask, "provenance": prov}
            if self.packed:
                batch["document_ids"] = doc_ids
            yield batch


class ProvenanceDataModule(pl.LightningDataModule):
    """Datamodule exposing ``train_source_weights`` and a ``StatefulDataLoader`` over :class:`ProvenanceBatches`.

    Args:
        num_workers: Dataloader workers.
        weights: Target weight per source (exposed normalised as ``train_source_weights``).
        dataset_kwargs: Extra :class:`ProvenanceBatches` arguments (``rank`` is filled in at load time).
    """

    def __init__(self, num_workers: int = 2, weights: dict[str, float] | None = None, **dataset_kwargs: Any) -> None:
        super().__init__()
        self.num_workers = num_workers
        weights = dict(weights or DEFAULT_WEIGHTS)
        total = sum(weights.values())
        self.train_source_weights = {k: v / total for k, v in weights.items()}
        self.dataset_kwargs = dataset_kwargs

    def train_dataloader(self) -> StatefulDataLoader:
        dataset = ProvenanceBatches(rank=self.trainer.global_rank, **self.dataset_kwargs)
        return StatefulDataLoader(dataset, batch_size=None, num_workers=self.num_workers)


class RecordingModule(pl.LightningModule):
    """One-parameter model that records the provenance of every batch it trains on.

    Args:
        records_path: If given, ``on_train_end`` writes the records as JSON there (atomically).
    """

    def __init__(self, records_path: str | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.records: list[dict[str, list]] = []
        self.records_path = records_path

    def training_step(self, batch: Batch, batch_idx: int) -> torch.Tensor:
        prov = batch["provenance"]
        record = {k: list(v) for k, v in prov.items()}
        record["padding"] = [int((batch["attention_mask"] == 0).sum()), batch["attention_mask"].numel()]
        record["packed_rows"] = [batch["document_ids"].shape[0]] if "document_ids" in batch else [0]
        self.records.append(record)
        x = batch["attention_mask"].float().mean().view(1, 1)
        return (self.layer(x) ** 2).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_end(self) -> None:
        if self.records_path is not None:
            write_json_atomic(self.records_path, self.records)


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON to ``path`` through a temporary file and a rename.

    Args:
        path: Destination.
        obj: JSON-serialisable object.
    """
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f)
    os.replace(tmp, path)


def read_csv_metrics(path: str | os.PathLike) -> dict[int, dict[str, float]]:
    """Rows of a CSVLogger ``metrics.csv`` keyed by step, with empty cells dropped.

    Args:
        path: The ``metrics.csv`` file.
    """
    rows: dict[int, dict[str, float]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            values = {k: float(v) for k, v in row.items() if k != "step" and v not in ("", None)}
            if values:
                rows.setdefault(int(row["step"]), {}).update(values)
    return rows


def read_dataset_rows(path: str | os.PathLike) -> dict[int, dict[str, float]]:
    """Rows holding ``dataset/...`` values, keyed by the optimizer step they were computed at.

    Lightning logs the train loss of the batch that makes ``global_step`` reach ``n`` at CSV step
    ``n - 1``; the dataset metrics computed after that batch share its row.

    Args:
        path: The ``metrics.csv`` file.
    """
    rows = read_csv_metrics(path)
    return {step + 1: row for step, row in rows.items() if any(k.startswith("dataset/") for k in row)}


def reference_metrics(
    per_rank_batches: Sequence[Sequence[dict[str, list]]],
    window: int,
    weights: dict[str, float] | None = None,
    stream_name: str = "all",
) -> dict[str, dict[str, float]]:
    """Independent reference for the global metrics, from each rank's trained-batch records in order.

    Counters are sums over ranks; the distribution statistics come from the union of each rank's
    last ``window`` lengths per name.

    Args:
        per_rank_batches: For each rank, the recorded provenance of its trained batches, in order.
        window: Per-rank window size.
        weights: Normalised target weights, if any.
        stream_name: Name of the whole-stream group.
    """
    per_name: dict[str, dict[str, Any]] = {}
    padding = positions = packed_rows = packed_docs = 0
    for batches in per_rank_batches:
        rank_lengths: dict[str, list[int]] = {}
        for rec in batches:
            padding += rec["padding"][0]
            positions += rec["padding"][1]
            packed_rows += rec["packed_rows"][0]
            packed_docs += len(rec["source"]) if rec["packed_rows"][0] else 0
            for src, ep, tok, new in zip(rec["source"], rec["epoch"], rec["tokens"], rec["new_document"]):
                for name in (stream_name, src):
                    m = per_name.setdefault(name, {"samples_seen": 0, "tokens_seen": 0, "epochs_completed": 0})
                    m["samples_seen"] += int(bool(new))
                    m["tokens_seen"] += tok
                    m["epochs_completed"] = max(m["epochs_completed"], ep)
                    rank_lengths.setdefault(name, []).append(tok)
        for name, lengths in rank_lengths.items():
            per_name[name].setdefault("_window", []).extend(lengths[-window:])
    out: dict[str, dict[str, float]] = {}
    total = per_name[stream_name]
    for name, m in per_name.items():
        w = m.pop("_window")
        m.update(
            seq_len_window_size=len(w), seq_len_mean=statistics.fmean(w), seq_len_p50=float(statistics.median(w))
        )
        if name != stream_name:
            m["share"] = m["samples_seen"] / total["samples_seen"]
            m["token_share"] = m["tokens_seen"] / total["tokens_seen"]
            if weights and name in weights:
                m["target_weight"] = weights[name]
        out[name] = m
    out[stream_name]["padding_share"] = padding / positions
    if packed_rows:
        out[stream_name]["packing_efficiency"] = 1 - padding / positions
        out[stream_name]["docs_per_pack"] = packed_docs / packed_rows
    return out


def build_trainer(
    out_dir: Path,
    max_steps: int,
    log_every_n_steps: int,
    window: int,
    ddp: bool,
    ckpt_every: int | None,
    **trainer_kwargs: Any,
) -> tuple[pl.Trainer, DatasetMetricsCallback]:
    """A CPU Trainer with the metrics callback, a CSVLogger in ``out_dir/csv`` and optional checkpoints.

    Args:
        out_dir: Where logs and checkpoints go.
        max_steps: Optimizer steps to train.
        log_every_n_steps: The callback's logging interval.
        window: The callback's ``seq_len_stat_window_size``.
        ddp: Two gloo processes with ``strategy="ddp"`` instead of one process.
        ckpt_every: Save a checkpoint every this many steps (all kept), or ``None``.
        trainer_kwargs: Further ``Trainer`` arguments (they override the defaults, ``logger`` included).
    """
    metrics_cb = DatasetMetricsCallback(log_every_n_steps=log_every_n_steps, seq_len_stat_window_size=window)
    callbacks: list[pl.Callback] = [metrics_cb]
    if ckpt_every is not None:
        callbacks.append(
            ModelCheckpoint(
                dirpath=out_dir / "ckpt", filename="{step}", every_n_train_steps=ckpt_every, save_top_k=-1
            )
        )
    kwargs: dict[str, Any] = dict(
        accelerator="cpu",
        devices=2 if ddp else 1,
        strategy="ddp" if ddp else "auto",
        max_steps=max_steps,
        callbacks=callbacks,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=1,
    )
    kwargs.update(trainer_kwargs)
    if "logger" not in kwargs:
        kwargs["logger"] = CSVLogger(out_dir, name="csv", version=0)
    trainer = pl.Trainer(**kwargs)
    return trainer, metrics_cb


def main(argv: Sequence[str]) -> None:
    """Entry point of the DDP run (see module docstring).

    Args:
        argv: ``[OUT_DIR, "fit"]`` or ``[OUT_DIR, "resume", CKPT_PATH]``.
    """
    out_dir, mode = Path(argv[0]), argv[1]
    ckpt_path = argv[2] if mode == "resume" else None
    run_dir = out_dir / mode
    trainer, metrics_cb = build_trainer(
        run_dir, max_steps=5 if mode == "fit" else 7, log_every_n_steps=2, window=6, ddp=True,
        ckpt_every=2 if mode == "fit" else None,
    )
    datamodule = ProvenanceDataModule(num_workers=2, rank_length_shift=15)
    model = RecordingModule(records_path=str(out_dir / f"{mode}_records_rank{trainer.global_rank}.json"))
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    if trainer.is_global_zero:
        write_json_atomic(
            out_dir / f"{mode}_result.json",
            {
                "world_size": trainer.world_size,
                "metrics_csv": str(run_dir / "csv" / "version_0" / "metrics.csv"),
                "checkpoints": sorted(str(p) for p in (run_dir / "ckpt").glob("*.ckpt")),
                "get_metrics": metrics_cb.get_metrics(),
                "source_weights": datamodule.train_source_weights,
            },
        )


if __name__ == "__main__":
    main(sys.argv[1:])
