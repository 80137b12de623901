"""Where a batch's time goes on the in-process hot path (standalone; writes results/hotpath-breakdown.md).

Usage (from the repository root, after ``run_all.py`` has built ``benchmarks/.data``)::

    python benchmarks/breakdown_hotpath.py [--token-docs 200000] [--calls 2000]

CPU microseconds per batch (``time.process_time``, so load from other processes barely matters),
each component called on its own, same cache as the suite: the stream producing one batch's
samples (in one ``take`` call where the stream offers it, as the train loader takes them), the collator, the record of the stream's state the loader takes after every batch (a lazy
``snapshot`` where the stream has one, else ``state_dict``), and the whole batch
through ``train_dataloader()``; the difference is the loader's own work plus what the components
miss by being timed one at a time on data already in the CPU caches (in the real loop every batch
reads fresh documents). The blocks reader of
``bench_hotpath.py`` is timed the same way for scale.

A second table sets a ``best_fit`` batch against the best-fit floor of ``bench_hotpath.py`` (the
same packs and outputs with Python only to place each document, no state, provenance or loader)
plus the costs the floor leaves out that any loader with this package's guarantees pays: the
train loader itself (the ``StatefulDataLoader`` in the resumable wrapper, in-process, batches of 8
trivial items, no collation), the keyed
permutation that replaces a stored shuffle order (mapping one batch's worth of positions to
rows), and the state recorded after every batch.

A fourth table times the parts of ours and of the floors inside the real loop, where every batch
reads fresh documents and runs with the caches the rest of the loop leaves: each part's method is
wrapped with a wall-clock timer (~0.1 µs per call) for a run of batches, and the whole batch is
timed around them; "the rest" is the whole minus the parts.

A third table does the same for an unpacked batch of 16 documents: the padded floor (the same
documents, whole-batch NumPy padding of the four outputs, nothing else) plus the
train loader alone (16 trivial items), the stream handing out the batch's 16 documents one
at a time (the first table's "samples from the stream") and the state record, against ours and the
``datasets`` baseline of section 9, all alternated round by round.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from bench_hotpath import (PACKED_BATCH, BestFitFloor, BlocksReader, DocumentFloor, PaddedFloor,  # noqa: E402
                           flat_offsets, flat_tokens)
from bench_throughput import hf_baseline_loader  # noqa: E402
from common import RESULTS_DIR  # noqa: E402


ROUNDS = 5


def cpu_us(fn, calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - start) / calls * 1e6


class _Trivial(torch.utils.data.IterableDataset):
    """Yields ``1`` forever, with a state that costs nothing: a loader around it costs only its own work."""

    def __iter__(self):
        while True:
            yield 1

    def snapshot(self):
        return dict

    def state_dict(self) -> dict:
        return {}


def loader_alone_us(calls: int, batch_size: int = PACKED_BATCH) -> float:
    """One in-process batch of ``batch_size`` trivial items, no collation, through the train loader
    ours uses: a ``StatefulDataLoader`` in the resumable wrapper that records a state per batch."""
    from lightning_tune_data.loading.loaders import LoaderOptions, build_train_loader

    it = iter(build_train_loader(_Trivial(), list, LoaderOptions(batch_size=batch_size), seed=0))
    next(it)
    return cpu_us(lambda: next(it), calls)


def permutation_us_per_document(num_rows: int, calls: int) -> float:
    """The keyed permutation mapping positions to rows, per position (in calls of 4096 positions)."""
    from lightning_tune_data.sources.permutation import KeyedPermutation

    permutation = KeyedPermutation(num_rows, key=12345)
    positions = np.arange(4096, dtype=np.int64)

    def call() -> None:
        permutation(positions)
        positions[:] += 4096
        if positions[-1] >= num_rows:
            positions[:] -= positions[0]

    return cpu_us(call, max(calls // 10, 10)) / 4096


def parts_in_loop_us(make_batches, parts: dict[str, tuple[object, str]], calls: int) -> dict[str, float]:
    """Wall µs per batch of each part (``name: (owner, method name)``) inside ``calls`` batches of
    the iterator ``make_batches()`` returns, and the whole batch (``"whole"``): see
    :func:`common.parts_per_batch_us`."""
    return common.parts_per_batch_us(make_batches, parts, calls)


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
    measured: dict[str, dict[str, float]] = {}
    for name, packing, batch in (("packed concat", "concat", PACKED_BATCH), ("packed best_fit", "best_fit", PACKED_BATCH),
                                 ("unpacked", None, 16)):
        dm = common.make_datamodule(parquet, cache, False, packing, 0, batch)
        stream, collator = dm.build_train_stream(), dm.train_collator()
        it = iter(stream)
        samples = [next(it) for _ in range(batch)]
        take = getattr(it, "take", None)  # the packer hands out a batch's samples in one call, as the loader takes them
        produce = cpu_us((lambda: take(batch)) if take else (lambda: [next(it) for _ in range(batch)]), args.calls)
        collate = cpu_us(lambda: collator(samples), args.calls)
        state = cpu_us(getattr(stream, "snapshot", stream.state_dict), args.calls)  # what the loader takes per batch
        loader_it = iter(dm.train_dataloader())
        next(loader_it)
        whole = cpu_us(lambda: next(loader_it), args.calls)
        rows.append(f"| {name} | {batch} x 2048 | {produce:.0f} | {collate:.0f} | {state:.0f} | {whole:.0f} | "
                    f"{whole - produce - collate - state:.0f} |")
        counters = getattr(stream, "counters", {})
        documents = counters.get("documents", 0) / max(counters.get("packs", 0), 1) * batch
        measured[name] = {"whole": whole, "state": state, "documents": documents, "produce": produce}
    unpacked_dm = common.make_datamodule(parquet, cache, False, None, 0, 16)
    web = unpacked_dm._datasets["train"]["web"]
    flat = flat_tokens(web, args.data_dir / f"flat_tokens_{args.token_docs}.npy")
    offsets = flat_offsets(web, args.data_dir / f"flat_offsets_{args.token_docs}.npy")
    best_fit = measured["packed best_fit"]
    # The comparisons are alternated round by round (medians), so a slow spell of the machine
    # hits all of them alike.
    readers = {"blocks": BlocksReader(flat, PACKED_BATCH, 0), "shuffled-document floor": DocumentFloor(flat, offsets, PACKED_BATCH, 0),
               "best-fit floor": BestFitFloor(flat, offsets, PACKED_BATCH, 0)}
    ours = iter(common.make_datamodule(parquet, cache, False, "best_fit", 0, PACKED_BATCH).train_dataloader())
    next(ours)
    unpacked = {"padded floor": PaddedFloor(flat, offsets, 16, 0), "ours unpacked": iter(unpacked_dm.train_dataloader()),
                "datasets": iter(hf_baseline_loader(unpacked_dm, False, 16, 0, seed=0))}
    for reader in unpacked.values():
        next(reader)
    rounds: dict[str, list[float]] = {}
    for _ in range(ROUNDS):
        for name, reader in readers.items():
            rounds.setdefault(name, []).append(cpu_us(lambda: next(reader), max(args.calls // ROUNDS, 1)))
        rounds.setdefault("ours", []).append(cpu_us(lambda: next(ours), max(args.calls // ROUNDS, 1)))
        rounds.setdefault("loader", []).append(loader_alone_us(max(args.calls // ROUNDS, 1)))
        for name, reader in unpacked.items():
            rounds.setdefault(name, []).append(cpu_us(lambda: next(reader), max(args.calls // ROUNDS, 1)))
        rounds.setdefault("loader 16", []).append(loader_alone_us(max(args.calls // ROUNDS, 1), 16))
    middle = {name: common.median(values) for name, values in rounds.items()}
    blocks = middle["blocks"]
    rows.append(f"| blocks reader | {PACKED_BATCH} x 2049 | | | | {blocks:.0f} | |")
    for name in ("shuffled-document floor", "best-fit floor"):
        rows.append(f"| {name} | {PACKED_BATCH} x 2048 | | | | {middle[name]:.0f} | |")
    permutation = permutation_us_per_document(len(web), args.calls) * best_fit["documents"]
    floor, loader = middle["best-fit floor"], middle["loader"]
    bound = floor + loader + permutation + best_fit["state"]
    rows += ["", f"A `best_fit` batch ({best_fit['documents']:.0f} documents) against the best-fit floor and what "
             f"the floor leaves out (medians of {ROUNDS} alternated rounds):", "",
             "| | CPU µs per batch | blocks reader's time / this |", "|---|---:|---:|",
             f"| blocks reader | {blocks:.0f} | 1x |",
             f"| best-fit floor (placement in Python, everything else vectorised) | {floor:.0f} | {blocks / floor:.3f}x |",
             f"| + the train loader alone (StatefulDataLoader in the resumable wrapper, in-process, 8 trivial items) | {loader:.0f} | |",
             f"| + the keyed permutation for the batch's documents | {permutation:.0f} | |",
             f"| + the state recorded after the batch (first table) | {best_fit['state']:.0f} | |",
             f"| = the least a resumable `best_fit` loader pays | {bound:.0f} | {blocks / bound:.3f}x |",
             f"| ours, whole batch via train_dataloader() | {middle['ours']:.0f} | {blocks / middle['ours']:.3f}x |"]
    padded, stream_16 = middle["padded floor"], measured["unpacked"]
    datasets_us = middle["datasets"]
    unpacked_bound = padded + middle["loader 16"] + stream_16["produce"] + stream_16["state"]
    rows += ["", f"An unpacked batch (16 documents) against the padded floor and what the floor leaves out (medians of "
             f"{ROUNDS} alternated rounds):", "",
             "| | CPU µs per batch | `datasets` baseline's time / this |", "|---|---:|---:|",
             f"| `datasets` iterable + shuffle + pad collate (section 9's baseline) | {datasets_us:.0f} | 1x |",
             f"| padded floor (whole-batch NumPy, no Python per document) | {padded:.0f} | {datasets_us / padded:.1f}x |",
             f"| + the train loader alone (in-process, 16 trivial items) | {middle['loader 16']:.0f} | |",
             f"| + the stream handing out the 16 documents one at a time (first table) | {stream_16['produce']:.0f} | |",
             f"| + the state recorded after the batch (first table) | {stream_16['state']:.0f} | |",
             f"| = the least a resumable loader of documents one at a time pays | {unpacked_bound:.0f} | "
             f"{datasets_us / unpacked_bound:.1f}x |",
             f"| ours, whole batch via train_dataloader() | {middle['ours unpacked']:.0f} | "
             f"{datasets_us / middle['ours unpacked']:.1f}x |"]
    from lightning_tune_data.collate.packed import PackedCollator
    from lightning_tune_data.collate.padded import PaddedCollator
    from lightning_tune_data.loading.resumable_loader import ResumableLoader
    from lightning_tune_data.packing.progress import PackingProgress
    from lightning_tune_data.packing.strategies import get_strategy

    loop_calls = max(args.calls, 200)
    in_loop: dict[str, dict[str, float]] = {}
    in_loop["blocks reader"] = parts_in_loop_us(lambda: BlocksReader(flat, PACKED_BATCH, 1), {}, loop_calls)
    for strategy in ("concat", "best_fit", "greedy"):
        packed_dm = common.make_datamodule(parquet, cache, False, strategy, 0, PACKED_BATCH)
        in_loop[f"ours, {strategy}"] = parts_in_loop_us(
            lambda: iter(packed_dm.train_dataloader()),
            {"collation": (PackedCollator, "__call__"), "placement": (get_strategy(strategy), "place_block"),
             "block reading": (PackingProgress, "read_block"), "state record": (ResumableLoader, "_remember")},
            loop_calls)
    in_loop["best-fit floor"] = parts_in_loop_us(lambda: BestFitFloor(flat, offsets, PACKED_BATCH, 1),
                                                 {"placement": (BestFitFloor, "_place")}, loop_calls)
    in_loop["shuffled-document floor"] = parts_in_loop_us(lambda: DocumentFloor(flat, offsets, PACKED_BATCH, 1), {},
                                                          loop_calls)
    in_loop["ours, unpacked (16 documents)"] = parts_in_loop_us(
        lambda: iter(unpacked_dm.train_dataloader()),
        {"collation": (PaddedCollator, "__call__"), "state record": (ResumableLoader, "_remember")}, loop_calls)
    in_loop["padded floor (16 documents)"] = parts_in_loop_us(lambda: PaddedFloor(flat, offsets, 16, 1), {}, loop_calls)
    columns = ("collation", "placement", "block reading", "state record")
    rows += ["", f"Inside the real loop ({loop_calls} batches each, wall µs per batch; a floor's \"collation\" is "
             "everything but its placement, ours includes the provenance and per-piece bookkeeping; \"the rest\" is "
             "the train loader, handing out the stream's samples, and for ours the timers):", "",
             "| reader | whole batch | collation | placement | block reading | state record | the rest |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, parts in in_loop.items():
        if "floor" in name:
            parts = {"collation": parts["whole"] - parts.get("placement", 0.0), **parts}
        cells = [f"{parts[column]:.0f}" if column in parts else "" for column in columns]
        rest = parts["whole"] - sum(parts.get(column, 0.0) for column in columns)
        rows.append(f"| {name} | {parts['whole']:.0f} | " + " | ".join(cells) + f" | {rest:.0f} |")
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
