"""Benchmark 3: memory of the main process and the dataloader workers over a long run.

Runs the unpacked single-source train stream with ``num_workers=2`` for ``--memory-samples``
samples (1M by default; batch 64 so that the run takes well under a minute: the per-sample work
is the same, there are just fewer batches) through ``TextDataModule.train_dataloader()``, and
samples the memory of the main process and its worker processes (``psutil``) every
``SAMPLE_EVERY_S`` seconds.

Two measures per process group (main, workers summed), both from ``psutil.Process.memory_info()``:

* ``RSS``: resident set size. It includes the *file-backed* pages of the memory-mapped Arrow
  cache the process has touched: reading the whole cache once (a 1M-sample run is several passes
  over 200k documents) makes each reader's RSS grow by up to the cache size (~240 MB) even though
  those pages are shared page cache the kernel can drop at any time, not allocated memory.
* ``anonymous`` = ``rss - shared`` (Linux ``RssAnon``): memory the process allocated itself (heap,
  tensors, Python objects). A leak shows up here; the target (growth < 50 MB) is checked on it.

Growth = peak - value after the warm-up (the first ``WARMUP_FRACTION`` of the run).
"""

from __future__ import annotations

import threading
import time

from common import Result, log, make_datamodule, now

SAMPLE_EVERY_S = 0.25
WARMUP_FRACTION = 0.02
BATCH_SIZE = 64


class MemorySampler(threading.Thread):
    """Samples RSS and anonymous memory of this process and its children in the background."""

    def __init__(self, every_s: float = SAMPLE_EVERY_S) -> None:
        super().__init__(daemon=True)
        import psutil

        self.psutil = psutil
        self.every_s = every_s
        self.main = psutil.Process()
        self.samples: list[tuple[float, int, int, int, int, int]] = []  # t, main rss, main anon, workers rss, anon, n
        self._halt = threading.Event()

    def snapshot(self) -> tuple[float, int, int, int, int, int]:
        info = self.main.memory_info()
        w_rss = w_anon = n = 0
        for child in self.main.children(recursive=True):
            try:
                ci = child.memory_info()
            except self.psutil.Error:
                continue
            w_rss += ci.rss
            w_anon += ci.rss - ci.shared
            n += 1
        return (now(), info.rss, info.rss - info.shared, w_rss, w_anon, n)

    def run(self) -> None:
        while not self._halt.is_set():
            self.samples.append(self.snapshot())
            self._halt.wait(self.every_s)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def run(ctx) -> list[Result]:
    total = ctx.memory_samples
    dm = make_datamodule(ctx.token_parquet, ctx.cache_dir, False, None, 2, BATCH_SIZE)
    batches = total // BATCH_SIZE
    warm_batches = max(1, int(batches * WARMUP_FRACTION))
    sampler = MemorySampler()
    loader = dm.train_dataloader()
    it = iter(loader)
    start = now()
    sampler.start()
    warm_index = None
    for i in range(batches):
        next(it)
        if i + 1 == warm_batches:
            sampler.samples.append(sampler.snapshot())
            warm_index = len(sampler.samples) - 1
    elapsed = now() - start
    sampler.samples.append(sampler.snapshot())
    sampler.stop()
    del it, loader
    samples = sampler.samples
    warm = samples[warm_index]
    after = [s for s in samples[warm_index:] if s[5] == 2]  # while both workers were alive
    peak = [max(s[k] for s in after) for k in range(1, 5)]
    mb = 1 / 2**20
    log(f"memory: {batches * BATCH_SIZE:,} samples in {elapsed:.1f}s, {len(samples)} memory samples")
    config = f"unpacked, workers 2, bs {BATCH_SIZE}, {batches * BATCH_SIZE:,} samples"
    base = f"after warm-up ({warm_batches * BATCH_SIZE:,} samples)"
    results = []
    names = ["main RSS", "main anonymous", "workers RSS (sum)", "workers anonymous (sum)"]
    for k, name in enumerate(names):
        growth = (peak[k] - warm[k + 1]) * mb
        is_anon = "anonymous" in name
        results.append(Result(
            "3 memory", config, f"peak {name}", peak[k] * mb, "MB", base, warm[k + 1] * mb,
            "growth < 50 MB" if is_anon else "", (growth < 50) if is_anon else None,
            note=f"growth {growth:+.1f} MB" + ("" if is_anon else " (includes touched pages of the memory-mapped cache)"),
        ))
    results.append(Result("3 memory", config, "run throughput", batches * BATCH_SIZE / elapsed, "samples/s",
                          note=f"{elapsed:.1f}s for the run"))
    return results
