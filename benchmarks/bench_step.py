"""Benchmark 6: how much of a real training step waits for data.

A ``lightning.Trainer`` fits ``lightning_tune_data.models.TinyCausalLM`` (d_model 64, 2 layers, CPU)
for ``--fit-steps`` steps on the interleaved three-source mixture packed with ``best_fit``
(``max_seq_len`` 512, batch 8: the most expensive data path, at a step size where the tiny model's
step is short, i.e. a hard case for the loader), with ``num_workers=2`` (the target) and 0 (for
reference). No validation, logging or checkpointing.

Two independent measures, over the steps after the first ``SKIP_STEPS`` (worker start-up):

* callback: the gap from ``on_train_batch_end`` of step ``i`` to ``on_train_batch_start`` of step
  ``i + 1`` (the loop fetches the next batch there, plus Lightning's own bookkeeping and the batch
  transfer hooks), as a share of the step period (start to start). Baseline: the step period.
* ``SimpleProfiler``: total of ``[_TrainingEpochLoop].train_dataloader_next`` over the total time of
  the same steps (the profiler action that only wraps ``next()`` on the data fetcher).

Target (num_workers=2): data wait < 5 % of the step.
"""

from __future__ import annotations

import logging
import warnings

from common import Result, log, make_datamodule, median, now

SKIP_STEPS = 5
MAX_SEQ_LEN = 512
BATCH_SIZE = 8
DATA_NEXT = "[_TrainingEpochLoop].train_dataloader_next"


def _fit(ctx, num_workers: int) -> tuple[float, float, float, float]:
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.profilers import SimpleProfiler

    from lightning_tune_data.models import TinyCausalLM

    class StepTimer(pl.Callback):
        def __init__(self) -> None:
            self.starts: list[float] = []
            self.ends: list[float] = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            self.starts.append(now())

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            self.ends.append(now())

    torch.manual_seed(0)
    dm = make_datamodule(ctx.token_parquet, ctx.cache_dir, True, "best_fit", num_workers, BATCH_SIZE,
                         max_seq_len=MAX_SEQ_LEN)
    model = TinyCausalLM(vocab_size=dm.vocab_size, max_seq_len=MAX_SEQ_LEN, d_model=64, n_layers=2, n_heads=4)
    timer = StepTimer()
    profiler = SimpleProfiler(dirpath=str(ctx.data_dir / "scratch"), filename=f"fit-profile-workers{num_workers}")
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=ctx.fit_steps, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         limit_val_batches=0, num_sanity_val_steps=0, callbacks=[timer], profiler=profiler)
    trainer.fit(model, datamodule=dm)
    starts, ends = timer.starts, timer.ends
    gaps = [starts[i + 1] - ends[i] for i in range(SKIP_STEPS, len(starts) - 1)]
    periods = [starts[i + 1] - starts[i] for i in range(SKIP_STEPS, len(starts) - 1)]
    nexts = profiler.recorded_durations.get(DATA_NEXT, [])
    # next() for step i+1's batch ... happens in the same gaps; skip the warm-up calls as above
    steady_next = nexts[SKIP_STEPS + 1 : SKIP_STEPS + 1 + len(gaps)]
    return sum(gaps), sum(periods), sum(steady_next), median(periods)


def run(ctx) -> list[Result]:
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", ".*does not have many workers.*")
    warnings.filterwarnings("ignore", ".*set_vital.*")
    results = []
    for nw in (2, 0):
        start = now()
        gap, period, data_next, median_step = _fit(ctx, nw)
        log(f"step: workers {nw}: {ctx.fit_steps} steps in {now() - start:.1f}s, "
            f"wait {gap:.2f}s of {period:.2f}s, profiler next() {data_next:.2f}s")
        config = (f"TinyCausalLM d64x2 CPU, interleaved+best_fit {MAX_SEQ_LEN}, bs {BATCH_SIZE}, workers {nw}, "
                  f"{ctx.fit_steps - SKIP_STEPS - 1} steps")
        target = "< 5% of step" if nw == 2 else ""
        results.append(Result("6 fit step", config, "data wait (callback gap)", gap, "s", "step time (start to start)",
                              period, target, (gap / period < 0.05) if nw == 2 else None,
                              note=f"{100 * gap / period:.1f}% of the step; median step {1000 * median_step:.0f} ms"))
        results.append(Result("6 fit step", config, "data wait (SimpleProfiler train_dataloader_next)", data_next, "s",
                              "step time (start to start)", period, target,
                              (data_next / period < 0.05) if nw == 2 else None,
                              note=f"{100 * data_next / period:.1f}% of the step"))
    return results
