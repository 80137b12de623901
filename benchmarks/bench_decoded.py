"""MDS and LitData corpora whose documents sit between per-item headers: first open, one pass and
the local disk they take, this checkout against the package before they were read in place or
decoded with NumPy (its commit ``BASE``), in the same run.

* **LitData items written without ``TokensLoader``** (a size before each item's ids): now read in
  place as list views over the chunks; before, decoded once per node (a loop per item) into a kept
  token file.
* **MDS shards, zstd** (llm-foundry's ``tokens: ndarray:int32``): decoded once per node either way;
  now every sample at once with NumPy, before one sample at a time; documents of 50-1,000 tokens,
  and short samples of 4-24 tokens (where the per-sample cost shows).

Each case: ``TokenizedDatasetManager.setup`` on an empty node folder (the first open, which
decodes), then one pass of ``CorpusSource`` in a shuffled order summing every token, and the bytes
written under the node's ``tokenized/`` folder. Each package runs in its own fresh process;
best of ``--repeats``, alternating the two.

Usage: nice python benchmarks/bench_decoded.py [--documents 20000] [--repeats 2] (about a minute
on 2 shared CPUs with these defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

warnings.filterwarnings("ignore", message="An item was larger than the target chunk size")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests"))

#: The package before MDS and LitData items were read in place or decoded with NumPy.
BASE = "0790d07"

_MEASURE = """
import json, sys, time, shutil
from pathlib import Path
from lightning_tune_data import TokenizedDatasetManager
from lightning_tune_data.sources.corpus_source import CorpusSource
corpus_dir, node = sys.argv[1], Path(sys.argv[2])
shutil.rmtree(node, ignore_errors=True)
start = time.perf_counter()
corpus = TokenizedDatasetManager(corpus_dir).setup(None, node)
opened = time.perf_counter()
total = 0
for sample in CorpusSource(corpus, "bench", seed=1, num_passes=1):
    total += int(sample["input_ids"].sum())
done = time.perf_counter()
disk = sum(p.stat().st_size for p in node.rglob("*") if p.is_file())
import lightning_tune_data
print(json.dumps({"open": opened - start, "pass": done - opened, "disk": disk, "sum": total,
                  "package": lightning_tune_data.__file__}))
"""


def _measure(package: Path, corpus: Path, node: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(package)}
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(corpus), str(node)], env=env, check=True,
                         capture_output=True, text=True, cwd=node.parent).stdout  # not the checkout: PYTHONPATH's
    return json.loads(out.strip().splitlines()[-1])


def _write(root: Path, docs: list, short: list) -> None:
    """The documents as LitData items (uint16, default loader) and MDS samples (int32, zstd), and
    ``short`` ones as MDS samples too, in chunks / shards of 4 MB (the tools' defaults: 64 MB)."""
    from litdata.streaming.writer import BinaryWriter
    from tokenized_writers import _streaming_base

    writer = BinaryWriter(str(root / "litdata"), chunk_bytes="4MB")
    for i, doc in enumerate(docs):
        writer[i] = doc.astype("uint16")
    writer.done()
    writer.merge()
    for name, samples in (("mds", docs), ("mds-short", short)):
        with _streaming_base().MDSWriter(out=str(root / name), columns={"tokens": "ndarray:int32"},
                                         compression="zstd", size_limit=4 << 20) as mds:
            for doc in samples:
                mds.write({"tokens": doc.astype("int32")})


def main(argv: list[str] | None = None) -> None:
    import numpy as np
    from common import package_at

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-decoded-"))
    try:
        rng = np.random.default_rng(0)
        docs = [rng.integers(0, 50_000, size=int(n)) for n in rng.integers(50, 1_000, size=args.documents)]
        short = [rng.integers(0, 50_000, size=int(n)) for n in rng.integers(4, 24, size=5 * args.documents)]
        _write(root, docs, short)
        packages = {"before": package_at(BASE, root / "base"), "now": REPO}
        tokens = sum(len(doc) for doc in docs)
        print(f"litdata, mds: {args.documents:,} documents, {tokens / 1e6:.1f} M tokens (50-1,000 a document); "
              f"mds-short: {len(short):,} samples of 4-24 tokens; package before: {BASE}")
        print("| corpus | package | first open (s) | one pass (s) | disk under tokenized/ (MB) |")
        print("|---|---|---|---|---|")
        for corpus in ("litdata", "mds", "mds-short"):
            best: dict[str, dict] = {}
            for _ in range(args.repeats):
                for name, package in packages.items():
                    got = _measure(package, root / corpus, root / f"node-{name}")
                    keep = best.setdefault(name, got)
                    for key in ("open", "pass"):
                        keep[key] = min(keep[key], got[key])
            assert best["before"]["sum"] == best["now"]["sum"], "the two packages read other tokens"
            assert best["before"]["package"] != best["now"]["package"], "both runs imported the same package"
            for name in packages:
                row = best[name]
                print(f"| {corpus} | {name} | {row['open']:.2f} | {row['pass']:.2f} | {row['disk'] / 1e6:.1f} |")
            print(f"| {corpus} | now / before | {best['now']['open'] / best['before']['open']:.2f}x | "
                  f"{best['now']['pass'] / best['before']['pass']:.2f}x | |")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
