"""A packed batch's token rows: one fancy-index gather against the join of byte ranges (writes
results/gather-vs-join.md). Standalone; not part of the suite.

Usage (from the repository root, after ``run_all.py --only hotpath`` has built ``benchmarks/.data``)::

    python benchmarks/experiments/gather_vs_join.py [--token-docs 200000] [--batches 1000] [--rounds 5]

The packs of real ``concat`` and ``best_fit`` batches (``max_seq_len`` 2048, batch 8, one source,
taken from the packer as the train loader takes them) have their tokens written into the
batch's flat ``int64`` input plane, padding included, two ways, checked equal before timing:

* **join** (what ``PackedCollator`` does, ``packing.rows.write_rows``): one ``bytes.join`` of a
  memoryview slice per piece of the source's flat token array (plus cached padding), converted
  into the plane in one copy;
* **gather**: the int64 index ``repeat(piece starts - output starts, lengths) + arange`` built with
  NumPy, the flat array fancy-indexed once, the result cast into the plane, padding written per row.

The blocks reader of ``bench_hotpath.py`` (eight 2049-token windows copied into an ``int64`` block)
is timed in each round for scale. Wall µs per batch, median of ``--rounds`` alternated rounds, all
batches prepared before timing (the packer's own work is not in these numbers).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the suite's modules

import common  # noqa: E402
from bench_hotpath import PACKED_BATCH, SEQ, BlocksReader, flat_tokens, mixed_datamodule  # noqa: E402
from common import RESULTS_DIR, median  # noqa: E402

from lightning_tune_data.packing.pieces import LENGTH_AT  # noqa: E402
from lightning_tune_data.packing.rows import write_rows  # noqa: E402


def packs_of(dm, batches: int) -> list[list]:
    """The packs of ``batches`` batches, as the in-process train loader takes them."""
    stream = iter(dm.build_train_stream(0, 1))
    return [[sample.pack for sample in stream.take(PACKED_BATCH)] for _ in range(batches)]


def join(packs: list, out: np.ndarray) -> None:
    write_rows(packs, SEQ, 0, out)


def gather(packs: list, out: np.ndarray, flat: np.ndarray, arange: np.ndarray) -> None:
    lengths = np.array([ref[LENGTH_AT] for pack in packs for ref in pack.refs], dtype=np.int64)
    starts = np.array([position for pack in packs for position in pack.tokens], dtype=np.int64)
    total = int(lengths.sum())
    index = np.repeat(starts - (lengths.cumsum() - lengths), lengths)  # the pieces back to back
    index += arange[:total]
    gathered = flat[index]
    if total == out.shape[0]:  # no padding (every concat batch)
        np.copyto(out, gathered, casting="same_kind")
        return
    rows, first = out.reshape(len(packs), SEQ), 0
    for row, pack in enumerate(packs):  # each row's tokens, then its padding
        rows[row, : pack.length] = gathered[first : first + pack.length]
        rows[row, pack.length :] = 0
        first += pack.length


def timed(fn, items) -> float:
    start = time.perf_counter()
    for item in items:
        fn(item)
    return (time.perf_counter() - start) / len(items) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--token-docs", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA_DIR)
    args = parser.parse_args()
    data = args.data_dir
    ctx = SimpleNamespace(token_parquet=data / f"tokens_{args.token_docs}.parquet",
                          cache_dir=data / f"cache_{args.token_docs}")
    blocks_flat = flat_tokens(None, data / f"flat_tokens_{args.token_docs}.npy")
    arange = np.arange(PACKED_BATCH * SEQ, dtype=np.int64)
    out = np.empty(PACKED_BATCH * SEQ, dtype=np.int64)
    check = np.empty_like(out)
    rows = []
    times: dict[str, list[float]] = {}
    for strategy in ("concat", "best_fit"):
        batches = packs_of(mixed_datamodule(ctx, strategy, 1), args.batches)
        store = next(iter(batches[0][0].stores.values()))
        flat = np.asarray(store.flat_tokens()).view(np.ndarray)
        for packs in batches[:50]:
            join(packs, out)
            gather(packs, check, flat, arange)
            assert np.array_equal(out, check), "gather and join disagree"
        for _ in range(args.rounds):
            reader = BlocksReader(blocks_flat, PACKED_BATCH, 0)
            times.setdefault("blocks", []).append(timed(lambda _: next(reader), range(args.batches)))
            times.setdefault(f"{strategy} join", []).append(timed(lambda packs: join(packs, out), batches))
            times.setdefault(f"{strategy} gather", []).append(
                timed(lambda packs: gather(packs, out, flat, arange), batches))
        pieces = sum(len(pack.refs) for packs in batches for pack in packs) / len(batches)
        rows.append((strategy, pieces))
    blocks = median(times["blocks"])
    info = common.machine_info()
    lines = ["# A packed batch's token rows: one fancy-index gather against the join of byte ranges", "",
             f"Command: `python benchmarks/experiments/gather_vs_join.py --token-docs {args.token_docs} --batches {args.batches} "
             f"--rounds {args.rounds}`", f"Finished {time.strftime('%Y-%m-%d %H:%M:%S')}; machine: {info['cpu model']}, "
             f"{info['cpus usable (sched_getaffinity)']} usable CPUs, load average {info['load average at start']}", "",
             "Wall µs per batch writing the tokens of 8 packs of 2048 into the batch's int64 plane (medians of "
             "alternated rounds; the blocks reader's whole batch for scale).", "",
             "| batch | pieces per batch | join (write_rows) | one gather | gather / join |", "|---|---:|---:|---:|---:|"]
    for strategy, pieces in rows:
        j, g = median(times[f"{strategy} join"]), median(times[f"{strategy} gather"])
        lines.append(f"| {strategy} | {pieces:.0f} | {j:.1f} | {g:.1f} | {g / j:.2f}x |")
    lines += ["", f"Blocks reader, whole [8, 2049] batch: {blocks:.1f} µs.", ""]
    path = RESULTS_DIR / "gather-vs-join.md"
    path.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
