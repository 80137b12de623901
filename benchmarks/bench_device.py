"""Benchmark 18: compact batches on an accelerator — the same batches, and what the GPU run gains.

Run on a machine with a CUDA device (on a CPU it runs the same code on ``cpu`` as a dry run)::

    python benchmarks/bench_device.py --out benchmarks/results/device

Two parts, one process, every configuration measured in the same run:

* **Through a Trainer** (``best_fit`` packing, three sources, ``max_seq_len`` 2048, batch 16, 4
  dataloader workers, a 4-layer ``TinyCausalLM`` in bf16 on the device): full batches
  (``compact_batches=False``) against compact batches expanded on the device after the copy, with
  and without ``pin_memory``. The first steps' batches, as the model receives them, are copied back
  and compared bit for bit across the configurations (the compact ones must equal the full ones);
  then steps per second and the time between one step's end and the next step's start (the
  loader's share of the step: fetching the next batch, the copy and the expansion).
* **One batch** (no Trainer): the host-to-device copy of a compact batch and of its full batch
  (pinned and not), and the expansion on the device against the expansion on the host, with the
  device's result compared bit for bit with the host's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DEFAULT_DATA_DIR, make_datamodule, write_token_parquet  # noqa: E402

CONFIGS = {  # name: (compact_batches, pin_memory)
    "full batches, pinned": (False, True),
    "compact, expanded on the device, pinned": (True, True),
    "compact, expanded on the device, not pinned": (True, False),
}


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_copy(batch: dict[str, Any]) -> dict[str, np.ndarray]:
    """The batch's tensors as host arrays (provenance left out: it is host data in every mode)."""
    return {key: value.detach().cpu().numpy().copy() for key, value in batch.items() if torch.is_tensor(value)}


class StepRecorder:
    """A callback keeping the first ``keep`` batches the model receives and every step's timestamps."""

    def __init__(self, keep: int, device: torch.device) -> None:
        import lightning as L

        recorder = self

        class _Callback(L.Callback):
            def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
                if len(recorder.batches) < keep:
                    recorder.batches.append(host_copy(batch))
                sync(device)
                recorder.starts.append(time.perf_counter())

            def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
                sync(device)
                recorder.ends.append(time.perf_counter())

        self.callback = _Callback()
        self.batches: list[dict[str, np.ndarray]] = []
        self.starts: list[float] = []
        self.ends: list[float] = []

    def summary(self, warmup: int) -> dict[str, float]:
        starts, ends = self.starts[warmup:], self.ends[warmup:]
        gaps = [start - end for start, end in zip(self.starts[warmup:], self.ends[warmup - 1 :])]
        steps = [end - start for start, end in zip(starts, ends)]
        return {"steps_per_s": (len(ends) - 1) / (ends[-1] - ends[0]), "gap_ms": 1e3 * statistics.median(gaps),
                "gap_mean_ms": 1e3 * statistics.fmean(gaps), "step_ms": 1e3 * statistics.median(steps)}


def fit(parquet: Path, cache: Path, args: argparse.Namespace, compact: bool, pin: bool) -> StepRecorder:
    import lightning as L

    from lightning_tune_data.models import TinyCausalLM

    device = torch.device("cuda" if args.accelerator == "gpu" else "cpu")
    dm = make_datamodule(parquet, cache, interleaved=True, packing="best_fit", num_workers=args.workers,
                         batch_size=args.batch_size, max_seq_len=args.seq_len, compact_batches=compact, pin_memory=pin)
    recorder = StepRecorder(args.compare, device)
    L.seed_everything(0, verbose=False)
    model = TinyCausalLM(max_seq_len=args.seq_len, d_model=args.d_model, n_layers=4, n_heads=8)
    trainer = L.Trainer(accelerator=args.accelerator, devices=1, max_steps=args.steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        precision="bf16-mixed" if args.accelerator == "gpu" else "32-true", callbacks=[recorder.callback],
                        limit_val_batches=0, num_sanity_val_steps=0)
    trainer.fit(model, datamodule=dm)
    return recorder


def one_batch(parquet: Path, cache: Path, args: argparse.Namespace) -> list[str]:
    """Copy and expansion of single batches, compact against full, device against host."""
    import lightning as L

    from lightning_tune_data.collate.expand import expand_batch

    device = torch.device("cuda" if args.accelerator == "gpu" else "cpu")
    lines = []
    batches = {}
    for compact in (True, False):
        dm = make_datamodule(parquet, cache, interleaved=True, packing="best_fit", num_workers=2,
                             batch_size=args.batch_size, max_seq_len=args.seq_len, compact_batches=compact)
        dm.trainer = L.Trainer(accelerator=args.accelerator, devices=1, logger=False)
        iterator = iter(dm.train_dataloader())
        batches[compact] = [next(iterator) for _ in range(args.compare)]
        dm.teardown("fit")

    def to_device(batch: dict[str, Any], pinned: bool) -> dict[str, Any]:
        return {key: (value.pin_memory() if pinned else value).to(device, non_blocking=pinned) if torch.is_tensor(value)
                else value for key, value in batch.items()}

    for name, compact in (("compact", True), ("full", False)):
        size = sum(v.numel() * v.element_size() for v in batches[compact][0].values() if torch.is_tensor(v))
        for pinned in (False, True):
            pinned_batches = [{k: (v.pin_memory() if torch.is_tensor(v) else v) for k, v in b.items()}
                              for b in batches[compact]] if pinned and device.type == "cuda" else batches[compact]
            times = []
            for batch in pinned_batches * 3:
                sync(device)
                start = time.perf_counter()
                to_device(batch, False)
                sync(device)
                times.append(time.perf_counter() - start)
            lines.append(f"| copy to {device.type}, {name} batch ({size / 1e6:.2f} MB), {'pinned' if pinned else 'pageable'} "
                         f"| {1e6 * statistics.median(times):.0f} µs |")
    host_times, device_times, equal = [], [], True
    for batch, full in zip(batches[True] * 3, batches[False] * 3):
        start = time.perf_counter()
        on_host = expand_batch(batch)
        host_times.append(time.perf_counter() - start)
        moved = to_device(batch, False)
        sync(device)
        start = time.perf_counter()
        on_device = expand_batch(moved)
        sync(device)
        device_times.append(time.perf_counter() - start)
        for key, value in host_copy(full).items():
            equal &= np.array_equal(value, on_host[key].numpy()) and np.array_equal(value, on_device[key].cpu().numpy())
    lines.append(f"| expansion on the host (NumPy) | {1e6 * statistics.median(host_times):.0f} µs |")
    lines.append(f"| expansion on {device.type} (torch, synchronised) | {1e6 * statistics.median(device_times):.0f} µs |")
    lines.append(f"| host and device expansions equal the collator's full batch, bit for bit | {'yes' if equal else '**NO**'} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="gpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each configuration, alternated")
    parser.add_argument("--compare", type=int, default=20, help="first batches compared bit for bit")
    parser.add_argument("--docs", type=int, default=100_000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--out", type=Path, default=None, help="write <out>.md")
    args = parser.parse_args(argv)
    parquet = args.data_dir / "device" / "tokens.parquet"
    write_token_parquet(parquet, args.docs)
    cache = args.data_dir / "device" / "cache"
    name = torch.cuda.get_device_name(0) if args.accelerator == "gpu" else "cpu"
    lines = [f"# Compact batches on {name}", "", f"Command: `python benchmarks/bench_device.py {' '.join(argv or sys.argv[1:])}`",
             f"torch {torch.__version__}; {args.docs:,} documents; best_fit, 3 sources, batch {args.batch_size} x "
             f"{args.seq_len}, {args.workers} workers; TinyCausalLM d_model {args.d_model}, 4 layers; {args.steps} steps, "
             f"timed after {args.warmup}; {args.rounds} rounds.", "",
             "| configuration | steps/s, median of rounds | ratio to full batches (per round) | median step ms | "
             "loader gap ms, median / mean (first round) | "
             f"first {args.compare} batches equal to full batches |", "|---|---:|---:|---:|---:|---|"]
    runs: dict[str, list[StepRecorder]] = {label: [] for label in CONFIGS}
    for round_ in range(args.rounds):  # the configurations alternate, so drifts of the machine hit each alike
        labels = list(CONFIGS) if round_ % 2 == 0 else list(reversed(CONFIGS))
        for label in labels:
            runs[label].append(fit(parquet, cache, args, *CONFIGS[label]))
    reference = runs["full batches, pinned"][0]
    rates = {label: [recorder.summary(args.warmup)["steps_per_s"] for recorder in recorders] for label, recorders in runs.items()}
    base = statistics.median(rates["full batches, pinned"])
    for label, recorders in runs.items():
        summary = recorders[0].summary(args.warmup)
        same = all(len(recorder.batches) == len(reference.batches) and all(
            mine.keys() == theirs.keys() and all(np.array_equal(mine[k], theirs[k]) for k in mine)
            for mine, theirs in zip(recorder.batches, reference.batches)) for recorder in recorders)
        rounds = ", ".join(f"{rate / full:.3f}" for rate, full in zip(rates[label], rates["full batches, pinned"]))
        lines.append(f"| {label} | {statistics.median(rates[label]):.2f} | {statistics.median(rates[label]) / base:.3f}x "
                     f"({rounds}) | {summary['step_ms']:.1f} | {summary['gap_ms']:.2f} / {summary['gap_mean_ms']:.2f} | "
                     f"{'yes' if same else '**NO**'} |")
    lines += ["", "| one batch | median |", "|---|---:|", *one_batch(parquet, cache, args)]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.with_suffix(".md").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
