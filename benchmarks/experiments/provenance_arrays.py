"""Provenance as lists (what batches carry) or as arrays: what each costs a worker and the main process.

A compact batch leaves a dataloader worker pickled inline; its provenance is a dict of per-document
lists (source names, passes, lengths, rows, flags, target counts). This measures, on real batches
of the packer (``concat`` over one source and ``best_fit`` over three, batch 8, 2048), CPU
microseconds per batch for:

* in the worker: building the provenance from the pieces' reference columns and pickling the whole
  compact batch, with lists (as the collator does) or with one ``[7, documents]`` int64 array plus
  int8 source codes and the source names;
* in the main process: unpickling that batch, both ways.

Usage (from the repository root, after ``run_all.py`` has built the 20,000-document cache)::

    python benchmarks/experiments/provenance_arrays.py [--token-docs 20000]
"""

from __future__ import annotations

import argparse
import itertools
import pickle
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import common  # noqa: E402

#: Provenance keys and the reference column each is read from here (``row`` and ``target_tokens`` stand in
#: for the batch row and the target count: ints of the same size, which is all pickling sees).
KEYS = {"epoch": 2, "tokens": 4, "row": 1, "new_document": 5, "dropped_before": 7, "truncated_tokens": 6,
        "target_tokens": 4}


def cpu_us(fn, calls: int = 5000) -> float:
    for _ in range(100):
        fn()
    start = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - start) / calls * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--token-docs", type=int, default=20_000)
    parser.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA_DIR)
    args = parser.parse_args()
    import run_all

    run_all.quiet()
    from lightning_tune_data.collate import PackedCollator

    parquet, cache = args.data_dir / f"tokens_{args.token_docs}.parquet", args.data_dir / f"cache_{args.token_docs}"
    common.write_token_parquet(parquet, args.token_docs)
    print("| batch | documents | worker, build + pickle: lists | arrays | main process, unpickle: lists | arrays |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, interleaved, strategy in (("concat, 1 source", False, "concat"), ("best_fit, 3 sources", True, "best_fit")):
        dm = common.make_datamodule(parquet, cache, interleaved, strategy, 0, 8)
        samples = iter(dm.build_train_stream()).take(8)
        batch = {key: value.numpy() if hasattr(value, "numpy") else value
                 for key, value in PackedCollator(pad_id=0, max_seq_len=2048, compact=True)(samples).items()}
        refs = list(itertools.chain.from_iterable(sample.pack.refs for sample in samples))
        columns = tuple(zip(*refs))
        names = sorted(set(columns[0]))

        def as_lists():
            return {"source": list(columns[0]), **{key: list(columns[i]) for key, i in KEYS.items()}}

        def as_arrays():
            codes = np.array(list(map(names.index, columns[0])), dtype=np.int8)
            return {"names": names, "codes": codes, "values": np.array([columns[i] for i in KEYS.values()],
                                                                      dtype=np.int64)}

        def sent(build):
            return pickle.dumps({**batch, "provenance": build()}, protocol=pickle.HIGHEST_PROTOCOL)

        lists, arrays = sent(as_lists), sent(as_arrays)
        print(f"| {name} | {len(refs)} | {cpu_us(lambda: sent(as_lists)):.1f} | {cpu_us(lambda: sent(as_arrays)):.1f} | "
              f"{cpu_us(lambda: pickle.loads(lists)):.1f} | {cpu_us(lambda: pickle.loads(arrays)):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
