"""One round of a paired comparison of the packed paths between two versions of the package.

Prints one ``RESULT`` line of JSON: for ``concat``, ``best_fit`` and ``greedy`` over one source
and a mixture of three, the blocks reader's CPU time per batch divided by the packed path's
(``train_dataloader()``, in-process, ``max_seq_len`` 2048, batch 8), each measured right after
the other in this process. CPU time (``time.process_time``) because load from other processes on
a shared machine moves wall-clock ratios by 2x between rounds. Run it alternately for each version
(the package on ``PYTHONPATH``), for example::

    git archive <commit> lightning_tune_data | tar -x -C /tmp/base
    for round in 1 2 3 4 5; do
        PYTHONPATH=/tmp/base python benchmarks/experiments/paired_packed_paths.py
        PYTHONPATH=$PWD python benchmarks/experiments/paired_packed_paths.py
    done

Needs the suite's 200,000-document cache (``run_all.py --only hotpath`` builds it).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the suite's modules

import bench_hotpath  # noqa: E402
from bench_hotpath import PACKED_BATCH, BlocksReader, flat_tokens  # noqa: E402

import lightning_tune_data  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / ".data"
BATCHES = int(os.environ.get("BATCHES", "800"))


def cpu_us(it) -> float:
    """CPU µs per batch of ``BATCHES`` batches after 5 warm-up batches."""
    for _ in range(5):
        next(it)
    start = time.process_time()
    for _ in range(BATCHES):
        next(it)
    return (time.process_time() - start) / BATCHES * 1e6


def main() -> int:
    ctx = SimpleNamespace(token_parquet=DATA / "tokens_200000.parquet", cache_dir=DATA / "cache_200000")
    cases = [(strategy, sources) for sources in (1, 3) for strategy in ("concat", "best_fit", "greedy")]
    modules = {case: bench_hotpath.mixed_datamodule(ctx, *case) for case in cases}
    flat = flat_tokens(None, DATA / "flat_tokens_200000.npy")
    out = {"package": lightning_tune_data.__file__}
    for case in cases:
        blocks = cpu_us(BlocksReader(flat, PACKED_BATCH, 0))
        out[f"{case[0]}/{case[1]}"] = blocks / cpu_us(iter(modules[case].train_dataloader()))
    print("RESULT", json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
