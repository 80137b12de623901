"""Benchmark: the cost of a mixture schedule on the packed hot path, against fixed weights in the same run.

Two comparisons, alternated repeat by repeat (medians of ``--repeats``), in-process (``num_workers=0``):

* **Packed loader.** ``TextDataModule.train_dataloader()`` with ``best_fit`` packing (``max_seq_len``
  2048, batch 8) over three sources (``common.SOURCE_WEIGHTS``, all over the same cached file).
  Baseline: the managers' fixed weights. Ours: an anneal schedule over the run
  (``unit: steps``, ``linear``: 0.5/0.3/0.2 until 80% of the run, then to 0.2/0.2/0.6 at its end,
  over 1,000 steps, so the measured batches cross many quanta). Goal: >= 0.95x tokens/s (at most
  5% overhead).
* **Draws alone.** The mixture's block reads (what the packer asks the mixer for): documents
  drawn per second with the schedule against fixed weights, without packing or collation. No
  goal: it shows where a schedule's cost would sit.

Run alone with small sizes: ``python benchmarks/bench_schedule.py`` (under a minute).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from bench_throughput import _drain
from common import SOURCE_WEIGHTS, Result, log, make_datamodule, median, now

SEQ = 2048
BATCH = 8
#: An anneal over a 1,000-step run: the first three sources' mix, then a high-quality-heavy one.
ANNEAL = {"unit": "steps", "interpolation": "linear", "points": [
    {"at": 0, "weights": dict(SOURCE_WEIGHTS)},
    {"at": 800, "weights": dict(SOURCE_WEIGHTS)},
    {"at": 1000, "weights": {"web": 0.2, "code": 0.2, "books": 0.6}}]}
RUN_STEPS = 1000


class _Trainer:
    """What the datamodule's plan reads from a Trainer: the run's length and layout."""

    max_steps = RUN_STEPS
    world_size = 1
    accumulate_grad_batches = 1
    loggers: list = []


def _datamodule(ctx, scheduled: bool):
    dm = make_datamodule(ctx.token_parquet, ctx.cache_dir, True, "best_fit", 0, BATCH, SEQ,
                         mix_schedule=ANNEAL if scheduled else None)
    if scheduled:
        dm.mixture.prepare_for(dm, _Trainer(), "fit")
    return dm


def _draws_per_second(dm, budget_s: float) -> float:
    """Documents a fresh train stream's mixture draws per second, in blocks of 2,048."""
    mixture = dm.build_train_stream().dataset  # the packer's child: the mixture
    mixture.read_block(2048)  # warm-up
    drawn, start = 0, now()
    while now() - start < budget_s:
        mixture.read_block(2048)
        drawn += 2048
    return drawn / (now() - start)


def run(ctx) -> list[Result]:
    """Packed tokens/s and draws/s with a schedule and with fixed weights, alternated per repeat."""
    budget = ctx.throughput_budget_s
    fixed, scheduled = _datamodule(ctx, False), _datamodule(ctx, True)
    rates: dict[str, list[float]] = {"fixed": [], "scheduled": [], "fixed_draws": [], "scheduled_draws": []}
    for repeat in range(ctx.repeats):
        for name, dm in (("fixed", fixed), ("scheduled", scheduled)) if repeat % 2 == 0 else (
                ("scheduled", scheduled), ("fixed", fixed)):
            wall, _, tokens, _ = _drain(dm.train_dataloader, budget)
            rates[name].append(tokens / wall)
            rates[f"{name}_draws"].append(_draws_per_second(dm, budget))
    value, baseline = median(rates["scheduled"]), median(rates["fixed"])
    draws, draws_baseline = median(rates["scheduled_draws"]), median(rates["fixed_draws"])
    log(f"schedule: packed {value:,.0f} vs {baseline:,.0f} tokens/s; draws {draws:,.0f} vs {draws_baseline:,.0f}/s")
    return [
        Result("schedule", f"best_fit, {SEQ}, batch {BATCH}, 3 sources, in-process", "tokens/s", value, "tokens/s",
               "fixed weights (same run)", baseline, ">= 0.95x (<= 5% overhead)", value >= 0.95 * baseline,
               "linear anneal over 1,000 steps; quanta crossed while measuring", rates["scheduled"]),
        Result("schedule", "mixture block reads (2,048 draws), 3 sources", "documents/s", draws, "documents/s",
               "fixed weights (same run)", draws_baseline, "", None, "no packing, no collation",
               rates["scheduled_draws"]),
    ]


def main() -> int:
    """Standalone: a small corpus, short budgets (under a minute on 2 cores)."""
    import argparse

    import common
    from run_all import Context, quiet

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--budget", type=float, default=1.5)
    parser.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA_DIR)
    args = parser.parse_args()
    quiet()
    ctx = Context(quick=True, data_dir=args.data_dir, token_docs=args.docs, throughput_budget_s=args.budget,
                  repeats=args.repeats, resume_repeats=1, memory_samples=0, prepare_docs=0, prepare_repeats=0,
                  packing_docs=0, fit_steps=0)
    ctx.data_dir.mkdir(parents=True, exist_ok=True)
    ctx.token_parquet = ctx.data_dir / f"tokens_{ctx.token_docs}.parquet"
    ctx.token_meta = common.write_token_parquet(ctx.token_parquet, ctx.token_docs)
    start = time.perf_counter()
    results = run(ctx)
    print(common.markdown_table(results))
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
