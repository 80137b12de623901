"""Where a batch's time goes on the in-process hot path (standalone; writes results/hotpath-breakdown.md).

Usage (from the repository root, after ``run_all.py`` has built ``benchmarks/.data``)::

    python benchmarks/breakdown_hotpath.py [--token-docs 200000] [--calls 2000]

CPU microseconds per batch (``time.process_time``, so load from other processes barely matters),
each component called on its own, same cache as the suite: the stream producing one batch's
samples, the collator, the record of the stream's state the loader takes after every batch (a lazy
``snapshot`` where the stream has one, else ``state_dict``), and the whole batch
through ``train_dataloader()``; the difference is the loader's own work plus what the components
miss by being timed one at a time on data already in the CPU caches (in the real loop every batch
reads fresh documents). The blocks reader of
``bench_hotpath.py`` is timed the same way for scale.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from bench_hotpath import PACKED_BATCH, BlocksReader, flat_tokens  # noqa: E402
from common import RESULTS_DIR  # noqa: E402


def cpu_us(fn, calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - start) / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--token-docs", type=int, default=200_000)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA_DIR)
    args = parser.parse_args()
    import run_all

    run_all.quiet()
    parquet = args.data_dir / f"tokens_{args.token_docs}.parquet"
    common.write_token_parquet(parquet, args.token_docs)
    cache = args.data_dir / f"cache_{args.token_docs}"
    rows = ["| path | batch | samples from the stream | collate | state after the batch | whole batch via train_dataloader() | rest: loader and cold caches |",
            "|---|---|---:|---:|---:|---:|---:|"]
    for name, packing, batch in (("packed concat", "concat", PACKED_BATCH), ("packed best_fit", "best_fit", PACKED_BATCH),
                                 ("unpacked", None, 16)):
        dm = common.make_datamodule(parquet, cache, False, packing, 0, batch)
        stream, collator = dm.build_train_stream(), dm.train_collator()
        it = iter(stream)
        samples = [next(it) for _ in range(batch)]
        produce = cpu_us(lambda: [next(it) for _ in range(batch)], args.calls)
        collate = cpu_us(lambda: collator(samples), args.calls)
        state = cpu_us(getattr(stream, "snapshot", stream.state_dict), args.calls)  # what the loader takes per batch
        loader_it = iter(dm.train_dataloader())
        next(loader_it)
        whole = cpu_us(lambda: next(loader_it), args.calls)
        rows.append(f"| {name} | {batch} x 2048 | {produce:.0f} | {collate:.0f} | {state:.0f} | {whole:.0f} | "
                    f"{whole - produce - collate - state:.0f} |")
    web = common.make_datamodule(parquet, cache, False, None, 0, 16)._datasets["train"]["web"]
    reader = BlocksReader(flat_tokens(web, args.data_dir / f"flat_tokens_{args.token_docs}.npy"), PACKED_BATCH, 0)
    blocks = cpu_us(lambda: next(reader), args.calls)
    rows.append(f"| blocks reader | {PACKED_BATCH} x 2049 | | | | {blocks:.0f} | |")
    info = common.machine_info()
    text = "\n".join([
        "# Hot path: CPU microseconds per batch, by component", "",
        f"Command: `python benchmarks/breakdown_hotpath.py --token-docs {args.token_docs} --calls {args.calls}`",
        f"Finished {time.strftime('%Y-%m-%d %H:%M:%S')}; machine: {info['cpu model']}, "
        f"{info['cpus usable (sched_getaffinity)']} usable CPUs, load average {info['load average at start']}; "
        f"python {info['python']}, numpy {info['numpy']}, torch {info['torch']}.", "",
        *rows, ""])
    out = RESULTS_DIR / "hotpath-breakdown.md"
    out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
