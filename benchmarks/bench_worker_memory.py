"""Benchmark 11: where the dataloader workers' anonymous memory growth comes from.

``bench_memory.py`` measures the workers' anonymous memory (``rss - shared`` = ``RssAnon``) over
1M samples (unpacked, 2 workers, batch 64). This benchmark repeats that run next to a "before"
run and two controls, each with the same number of batches, so that a growth can be attributed:

* ``ours``: ``TextDataModule.train_dataloader()`` (``StatefulDataLoader``, a state snapshot of
  every worker after every batch, ``ResumableLoader``); the collator builds each batch's
  ``[4, 64, W]`` block directly in shared memory inside a worker (``worker_memory.batch_planes``);
* ``ours, batch block in ordinary memory (before)``: the same loader with the block allocated by
  ``torch.empty`` as before (torch then copies it into shared memory on the way out and frees
  it: a heap block of a different size every batch, which fragments glibc's heap);
* ``same stream + collator, plain DataLoader``: the same train stream and collator in a
  ``torch.utils.data.DataLoader`` (no state snapshots);
* ``transport only``: a ``torch.utils.data.DataLoader`` whose workers yield ready batches of four
  ``[64, W]`` int64 tensors, ``W`` drawn per batch like our padded widths (300..2048), no data work.

Reported per run: the workers' summed anonymous memory after a 2 % warm-up and its peak afterwards
(growth = peak - warm-up value), sampled every 0.25 s; for ours before/after also the run's
samples/s (the two runs follow each other).
"""

from __future__ import annotations

import contextlib
import gc

import numpy as np
import torch

from bench_memory import WARMUP_FRACTION, MemorySampler
from common import Result, log, make_datamodule, now

BATCH = 64


class VariableWidthBatches(torch.utils.data.IterableDataset):
    """Ready batches of four ``[64, W]`` int64 tensors, ``W`` random in 300..2048, no data work."""

    def __iter__(self):
        rng = np.random.default_rng(torch.utils.data.get_worker_info().id if torch.utils.data.get_worker_info() else 0)
        while True:
            width = int(rng.integers(300, 2049))
            block = torch.ones((4, BATCH, width), dtype=torch.int64)
            yield {"input_ids": block[0], "labels": block[1], "attention_mask": block[2], "position_ids": block[3]}


@contextlib.contextmanager
def heap_batch_blocks():
    """While active, the collator allocates its batch block with ``torch.empty`` (the earlier behaviour)."""
    import lightning_tune_data.collate.padded as collate

    def heap_planes(shape: tuple[int, ...], dtype: torch.dtype = torch.int64) -> tuple:
        block = torch.empty(shape, dtype=dtype)
        return block.numpy(), block.unbind(0)

    shared = collate.batch_planes
    collate.batch_planes = heap_planes
    try:
        yield
    finally:
        collate.batch_planes = shared


def _growth(loader, batches: int) -> tuple[float, float, float, str]:
    """(workers' anonymous MB after warm-up, growth MB after it, seconds, anonymous MB at 10/25/50/100 %)."""
    warm_batches = max(1, int(batches * WARMUP_FRACTION))
    sampler = MemorySampler()
    it = iter(loader)
    start = now()
    sampler.start()
    warm_index = None
    marks = {max(1, int(batches * f)): f for f in (0.1, 0.25, 0.5)}
    curve = []
    for i in range(batches):
        next(it)
        if i + 1 in marks:
            curve.append(f"{marks[i + 1]:.0%} {sampler.snapshot()[4] / 2**20:.0f}")
        if i + 1 == warm_batches:
            sampler.samples.append(sampler.snapshot())
            warm_index = len(sampler.samples) - 1
    elapsed = now() - start
    sampler.samples.append(sampler.snapshot())
    sampler.stop()
    if hasattr(it, "_shutdown_workers"):  # a torch DataLoader iterator
        it._shutdown_workers()
    if hasattr(loader, "_iterator"):  # ResumableLoader: stops its StatefulDataLoader's workers
        loader._iterator = None
    del it
    gc.collect()
    after = [s for s in sampler.samples[warm_index:] if s[5] == 2]
    warm = sampler.samples[warm_index][4]
    peak = max(s[4] for s in after)
    mb = 1 / 2**20
    curve.append(f"100% {sampler.samples[-1][4] * mb:.0f}")
    return warm * mb, (peak - warm) * mb, elapsed, "workers anonymous MB at " + ", ".join(curve)


def run(ctx) -> list[Result]:
    batches = ctx.memory_samples // BATCH
    dm = make_datamodule(ctx.token_parquet, ctx.cache_dir, False, None, 2, BATCH)
    plain = torch.utils.data.DataLoader(dm.build_train_stream(), batch_size=BATCH, num_workers=2,
                                        collate_fn=dm.train_collator(), prefetch_factor=2)
    transport = torch.utils.data.DataLoader(VariableWidthBatches(), batch_size=None, num_workers=2, prefetch_factor=2)
    runs = {
        "ours, batch block in ordinary memory (before)": (lambda: dm.train_dataloader(), heap_batch_blocks),
        "ours (StatefulDataLoader, snapshot per batch)": (lambda: dm.train_dataloader(), contextlib.nullcontext),
        "same stream + collator, plain DataLoader": (lambda: plain, contextlib.nullcontext),
        "transport only: ready [64, W] x4 batches": (lambda: transport, contextlib.nullcontext),
    }
    measured = {}
    for name, (factory, allocation) in runs.items():
        with allocation():  # workers fork inside the run, so they inherit the allocation in force
            measured[name] = _growth(factory(), batches)
        log(f"worker memory: {name}: warm {measured[name][0]:.0f} MB, growth {measured[name][1]:+.1f} MB "
            f"in {measured[name][2]:.0f}s")
    config = f"workers 2, bs {BATCH}, {batches * BATCH:,} samples"
    results = []
    for name, (warm, growth, seconds, curve) in measured.items():
        ours = name.startswith("ours (")
        results.append(Result("11 worker memory", f"{name}, {config}", "workers anonymous growth", growth, "MB",
                              "workers anonymous after warm-up", warm, "< 50 MB" if ours else "",
                              (growth < 50) if ours else None,
                              note=f"{seconds:.0f}s, {batches * BATCH / seconds:,.0f} samples/s; {curve}"))
    before, after = (measured[name] for name in list(runs)[:2])
    results.append(Result("11 worker memory", f"ours, {config}", "run throughput", batches * BATCH / after[2],
                          "samples/s", "batch block in ordinary memory (before)", batches * BATCH / before[2],
                          note="the two runs follow each other; growth before "
                               f"{before[1]:+.1f} MB, after {after[1]:+.1f} MB"))
    return results
