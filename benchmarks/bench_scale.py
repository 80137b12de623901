"""Benchmark 8: the train stream at scale — start-up, resume and memory per worker, state sizes.

Usage (from the repository root)::

    python benchmarks/bench_scale.py                 # 2M, 20M and 200M rows (~3 min, ~2 GB of disk)
    python benchmarks/bench_scale.py --rows 2000000  # one size
    python benchmarks/bench_scale.py --output benchmarks/results/scale.md

What is measured, each in a fresh Python process that plays one dataloader worker of rank 3 of 8
(``ArrowSource(table, rank=3, world_size=8)`` over a memory-mapped Arrow file of N one-token rows,
built synthetically; no tokenization):

* **first sample**: seconds from building the source to its first document, and the process's
  resident memory growth (RSS) over that;
* **resume**: the same for a source that loads a state from the middle of pass 3;
* **baseline** (same run, same process kind): what a stored permutation costs at that size,
  ``numpy.random.default_rng(...).permutation(N)`` — the time and memory every worker paid at every
  pass start and every resume before the pass order was computed per position.

Then the state sizes: the JSON size of one worker's train stream state (two interleaved sources
of log-normal documents, mean ~300 tokens) for every packing strategy at ``max_seq_len`` 2048 and
8192 (buffer 64), and the size of rank 0's checkpoint data state for 1,024 ranks x 4 workers
(``torch.save`` of the gathered state, built from one genuine worker state with its shard ids
rewritten), plus the time to merge those 4,096 shard states for a resume on another layout.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parent.parent
CHUNK_ROWS = 2_000_000


def build_table(path: Path, rows: int) -> None:
    """An Arrow IPC file of ``rows`` one-token documents, written chunk by chunk."""
    if path.exists():
        return
    tmp = path.with_suffix(".tmp")
    schema = pa.schema([("input_ids", pa.list_(pa.int32()))])
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        for start in range(0, rows, CHUNK_ROWS):
            count = min(CHUNK_ROWS, rows - start)
            offsets = pa.array(np.arange(count + 1, dtype=np.int32))
            values = pa.array((np.arange(start, start + count) % 50_000).astype(np.int32))
            writer.write_batch(pa.record_batch([pa.ListArray.from_arrays(offsets, values)], schema=schema))
    tmp.rename(path)


_PROBE = r"""
import json, sys, time, psutil, numpy as np, pyarrow as pa
path, mode, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
from lightning_tune_data.sources.arrow import ArrowSource  # imports are not what is measured
proc = psutil.Process()
table = pa.ipc.open_file(pa.memory_map(path, "r")).read_all()
rss0 = proc.memory_info().rss
start = time.perf_counter()
if mode == "baseline":
    order = np.random.default_rng([7, 3, 3]).permutation(rows)
    first = int(order[3])
else:
    source = ArrowSource(table, "web", seed=7, rank=3, world_size=8)
    if mode == "resume":
        state = source.state_dict()
        plan = state["web"]["walk"]["plan"]
        plan["epoch"], plan["tail_taken"] = 3, rows // 8 // 2
        source = ArrowSource(table, "web", seed=7, rank=3, world_size=8)
        source.load_state_dict(state)
    first = int(next(iter(source))["input_ids"][0])
elapsed = time.perf_counter() - start
print(json.dumps({"seconds": elapsed, "rss_mb": (proc.memory_info().rss - rss0) / 2**20, "first": first}))
"""


def probe(path: Path, mode: str, rows: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for attempt in range(2):
        out = subprocess.run([sys.executable, "-c", _PROBE, str(path), mode, str(rows)], capture_output=True,
                             text=True, env=env)
        if out.returncode == 0:
            return json.loads(out.stdout.strip().splitlines()[-1])
        print(f"[scale] probe {mode} {rows:,} failed (attempt {attempt + 1}):\n{out.stderr[-2000:]}", flush=True)
    raise RuntimeError(f"probe {mode} at {rows:,} rows failed twice")


def scale_rows(data_dir: Path, sizes: list[int], repeats: int) -> list[str]:
    lines = ["| rows | first sample | RSS growth | resume (pass 3, mid-pass) | RSS growth | stored permutation (baseline) | RSS growth | first sample vs baseline |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for rows in sizes:
        path = data_dir / f"scale_{rows}.arrow"
        t0 = time.perf_counter()
        build_table(path, rows)
        print(f"[scale] {rows:,} rows ready ({time.perf_counter() - t0:.1f}s)", flush=True)
        results = {}
        for mode in ("first", "resume", "baseline"):
            runs = [probe(path, mode, rows) for _ in range(repeats if mode != "baseline" or rows < 10**8 else 1)]
            results[mode] = {k: float(np.median([r[k] for r in runs])) for k in ("seconds", "rss_mb")}
            print(f"[scale] {rows:,} {mode}: {results[mode]}", flush=True)
        f, r, b = results["first"], results["resume"], results["baseline"]
        lines.append(f"| {rows:,} | {f['seconds'] * 1e3:.1f} ms | {f['rss_mb']:.1f} MB | {r['seconds'] * 1e3:.1f} ms | "
                     f"{r['rss_mb']:.1f} MB | {b['seconds']:.2f} s | {b['rss_mb']:.0f} MB | "
                     f"{b['seconds'] / max(f['seconds'], 1e-9):,.0f}x faster |")
    return lines


def _lognormal_table(count: int, seed: int, mean: float = 300.0) -> pa.Table:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(mean) - 0.5, 1.0, count), 2, 20_000).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = (np.arange(offsets[-1]) % 50_000).astype(np.int32)
    return pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))})


def _worker_state(packing: str | None, max_seq_len: int, tables: list[pa.Table], rank: int = 0, world_size: int = 1) -> dict:
    from lightning_tune_data.sources.arrow import ArrowSource
    from lightning_tune_data.mixing.interleave import InterleavedDataset
    from lightning_tune_data.packing.packer import IterablePackedDataset

    sources = [ArrowSource(t, name, seed=1, rank=rank, world_size=world_size, max_seq_len=None if packing == "concat" else max_seq_len)
               for t, name in zip(tables, ("web", "code"))]
    stream = InterleavedDataset(sources, [0.7, 0.3], seed=1, rank=rank, world_size=world_size)
    if packing is not None:
        stream = IterablePackedDataset(stream, max_seq_len, strategy=packing, buffer_size=64)
    iterator = iter(stream)
    for _ in range(500):
        next(iterator)
    return stream.state_dict()


def state_sizes() -> tuple[list[str], dict]:
    tables = [_lognormal_table(200_000, 1), _lognormal_table(100_000, 2)]
    lines = ["| packing | max_seq_len | state per worker (JSON) | documents held by reference |", "|---|---:|---:|---:|"]
    biggest = None
    for max_seq_len in (2048, 8192):
        for packing in (None, "greedy", "best_fit", "concat"):
            state = _worker_state(packing, max_seq_len, tables)
            size = len(json.dumps(state))
            held = len(next(iter(state.values())).get("packs", {}).get("row", [])) if packing else 0
            lines.append(f"| {packing or 'none'} | {max_seq_len} | {size / 1024:.1f} KB | {held} |")
            print(f"[scale] state {packing} {max_seq_len}: {size} bytes, {held} pieces", flush=True)
            if packing == "best_fit" and max_seq_len == 8192:
                biggest = state
    return lines, biggest


def checkpoint_size(worker_state: dict, ranks: int = 1024, workers: int = 4) -> list[str]:
    """Rank 0's gathered data state for ``ranks x workers`` shards, and the elastic merge of it."""
    import copy

    import torch

    from lightning_tune_data.sources.arrow import ArrowSource
    from lightning_tune_data.mixing.interleave import InterleavedDataset
    from lightning_tune_data.packing.packer import IterablePackedDataset

    num_shards = ranks * workers

    def shard_state(shard_id: int) -> dict:
        state = copy.deepcopy(worker_state)
        for source in state["packed_interleaved"]["child"]["interleaved"]["children"].values():
            walk = source["walk"]
            walk["num_shards"], walk["shard_id"] = num_shards, shard_id
            walk["plan"].update(stride=num_shards, offset=shard_id, end=num_shards * (walk["num_rows"] // num_shards))
            walk["plan"]["tail_taken"] = min(walk["plan"]["tail_taken"], walk["num_rows"] // num_shards)
        return state

    template = [shard_state(i) for i in range(workers)]
    gathered = {"version": 2, "signature": {}, "ranks": []}
    shards = []
    for rank in range(ranks):
        snapshots = {}
        for worker in range(workers):
            state = copy.deepcopy(template[worker]) if rank == 0 else shard_state(rank * workers + worker)
            snapshots[f"worker_{worker}"] = {"worker_id": worker, "dataset_state": state}
            shards.append(state)
        gathered["ranks"].append({"batches_consumed": 1000, "loader": {"epoch": 0, "loader": {"_snapshot": {"_worker_snapshots": snapshots}}}})
    buffer = io.BytesIO()
    torch.save(gathered, buffer)
    size = buffer.tell()
    tables = [_lognormal_table(200_000, 1), _lognormal_table(100_000, 2)]
    sources = [ArrowSource(t, name, seed=1, max_seq_len=8192) for t, name in zip(tables, ("web", "code"))]
    stream = IterablePackedDataset(InterleavedDataset(sources, [0.7, 0.3], seed=1), 8192, strategy="best_fit", buffer_size=64)
    start = time.perf_counter()
    merged = stream.merge_shard_states(shards)
    merge_s = time.perf_counter() - start
    held = len(merged["packed_interleaved"]["held"]["row"])
    print(f"[scale] checkpoint {size / 2**20:.1f} MB for {num_shards} shards; merge {merge_s:.2f}s, {held} held pieces", flush=True)
    return [
        "| shards (ranks x workers) | rank 0's data state (`torch.save`) | per shard | merge for a resume on another layout |",
        "|---:|---:|---:|---:|",
        f"| {ranks:,} x {workers} = {num_shards:,} | {size / 2**20:.1f} MB | {size / num_shards / 1024:.1f} KB | "
        f"{merge_s:.2f} s ({held:,} held documents re-dealt) |",
    ]


def streaming_buffer_state(buffer_sizes: tuple[int, ...] = (100, 1000)) -> list[str]:
    """JSON size of a streaming source's state per worker: its shuffle buffer keeps tokens (log-normal, mean ~300)."""
    import datasets

    from lightning_tune_data.sources.hf_streaming import HFStreamingSource

    table = _lognormal_table(20_000, 3)
    rows = table.column("input_ids").to_pylist()
    stream = datasets.Dataset.from_dict({"input_ids": rows}).to_iterable_dataset(num_shards=4)
    lines = ["| shuffle_buffer_size | state per worker (JSON) |", "|---:|---:|"]
    for size in buffer_sizes:
        source = HFStreamingSource(stream, "web", seed=1, shuffle_buffer_size=size)
        iterator = iter(source)
        for _ in range(2 * size):
            next(iterator)
        nbytes = len(json.dumps(source.state_dict()))
        lines.append(f"| {size} | {nbytes / 2**20:.2f} MB |")
        print(f"[scale] streaming buffer {size}: {nbytes} bytes", flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="*", default=[2_000_000, 20_000_000, 200_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data-dir", type=Path, default=Path(tempfile.gettempdir()) / "ltd_bench_scale")
    parser.add_argument("--output", type=Path, default=None, help="write the markdown here (default: print only)")
    args = parser.parse_args()
    args.data_dir.mkdir(parents=True, exist_ok=True)
    sections = ["## Start-up, resume and memory per worker (rank 3 of 8, one worker)", ""]
    sections += scale_rows(args.data_dir, sorted(args.rows), args.repeats)
    state_lines, biggest = state_sizes()
    sections += ["", "## Train stream state per worker (two interleaved sources, buffer 64, after 500 samples)", ""]
    sections += state_lines
    sections += ["", "## Rank 0's checkpoint data state at 1,024 ranks x 4 workers (best_fit, max_seq_len 8192)", ""]
    sections += checkpoint_size(biggest)
    sections += ["", "## A streaming source's state per worker (its shuffle buffer cannot be re-read, so it keeps tokens)", ""]
    sections += streaming_buffer_state()
    header = (f"# bench_scale.py results\n\nCommand: `python benchmarks/bench_scale.py --rows {' '.join(map(str, args.rows))}`\n"
              f"Machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, pyarrow {pa.__version__}, numpy {np.__version__}\n")
    text = header + "\n" + "\n".join(sections) + "\n"
    print(text)
    if args.output:
        args.output.write_text(text)


if __name__ == "__main__":
    main()
