"""Reading tokenized corpora in other tools' formats: open time, and document throughput against
our own store and against the tools' own readers, in the same run.

* **Open** a corpus of many small Megatron ``.bin``/``.idx`` pairs (``TokenizedDatasetManager.setup``:
  list, read every ``.idx``, check every ``.bin`` size): locally, and on the S3 stand-in (moto's
  server in its own process on 127.0.0.1, the objects written into its backend) under a
  ``cache_budget`` the corpus exceeds (read by byte ranges: nothing but the ``.idx`` files is
  fetched to open it): the first open on an empty node, a reopen, and the bare listing of the
  same prefix as the baseline (the floor any reader of those files pays).
* **Throughput**: the same documents read one at a time in a shuffled order, as token arrays:
  our reader over Megatron and datatrove files (``CorpusSource``), our own store of the same
  documents (``ArrowSource`` over a memory-mapped ``datasets.Dataset``), Megatron-Core's
  ``IndexedDataset`` visiting the same rows in the same order, and LitData's ``StreamingDataset``
  over its own chunks of the same documents (its own order, unshuffled; no DataLoader).
  Every reader touches every token of every document it returns (a sum), so none is lazier.

Usage: nice python benchmarks/bench_formats.py [--files 1000] [--s3-files 100] [--documents 5000] [--output FILE]
(under a minute with these defaults on 2 CPUs). The measured run (``results/formats.md``) is
``--files 10000 --s3-files 10000 --documents 20000`` (a few minutes: the stand-in lists about
1,000-3,000 objects a second and serves 100-270 small GETs a second on a shared 2-CPU machine); also
``python benchmarks/run_all.py --only formats [--quick]``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import shutil
import sys
import tempfile
import time
import warnings

warnings.filterwarnings("ignore", message="An item was larger than the target chunk size")
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from lightning_tune_data import ArrowSource, TokenizedDatasetManager  # noqa: E402
from lightning_tune_data.formats.remote_reads import CONCURRENT_REQUESTS  # noqa: E402
from lightning_tune_data.keys import INPUT_IDS, SOURCE_ROW  # noqa: E402
from lightning_tune_data.sources.corpus_source import CorpusSource  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
_MAGIC = b"MMIDIDX\x00\x00"


def write_megatron_pair(prefix: Path, docs: list[np.ndarray]) -> None:
    """A Megatron pair written from the layout (as ``IndexedDatasetBuilder`` writes it; fast for many files)."""
    lengths = np.array([len(d) for d in docs], dtype=np.int32)
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1].astype(np.int64) * 2)]).astype(np.int64)
    np.concatenate(docs).astype(np.uint16).tofile(f"{prefix}.bin")
    with open(f"{prefix}.idx", "wb") as handle:
        handle.write(_MAGIC + np.uint64(1).tobytes() + bytes([8]) + np.uint64(len(docs)).tobytes()
                     + np.uint64(len(docs) + 1).tobytes() + lengths.tobytes() + pointers.tobytes()
                     + np.arange(len(docs) + 1, dtype=np.int64).tobytes())


def documents(count: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(5.0, 0.8, size=count).astype(int), 8, 4000)
    flat = rng.integers(0, 50_000, size=int(lengths.sum()), dtype=np.uint16)
    return np.split(flat, np.cumsum(lengths)[:-1])


def timed(action, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - start)
    return best


def bench_open(root: Path, files: int) -> float:
    folder = root / f"open-{files}"
    folder.mkdir()
    docs = documents(4)
    for index in range(files):
        write_megatron_pair(folder / f"part-{index:05d}", docs)
    manager = TokenizedDatasetManager(str(folder), format="megatron")
    return timed(lambda: manager.setup(None, root / "node"))


def _serve(files: int) -> None:
    """moto's S3 server on 127.0.0.1 in this (child) process, holding ``files`` Megatron pairs under
    ``s3://corpus/mg/`` (written straight into its backend: no upload), its port printed first."""
    import logging

    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends
    from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["global"]
    backend.create_bucket("corpus", "us-east-1")
    folder = Path(tempfile.mkdtemp(prefix="bench-formats-serve-"))
    write_megatron_pair(folder / "pair", documents(4))
    pair = {suffix: (folder / f"pair{suffix}").read_bytes() for suffix in (".bin", ".idx")}
    for index in range(files):
        for suffix, data in pair.items():
            backend.put_object("corpus", f"mg/part-{index:05d}{suffix}", data)
    server = make_server("127.0.0.1", 0, DomainDispatcherApplication(create_backend_app), threaded=True,
                         request_handler=MotoRequestHandler)
    print(server.server_port, flush=True)
    server.serve_forever()


def bench_open_s3(root: Path, files: int) -> dict[str, float]:
    """Opening ``files`` pairs on the S3 stand-in (its own process), under a ``cache_budget`` the
    corpus exceeds (read by byte ranges: no ``.bin`` is copied): the first open on an empty node
    (list, fetch every ``.idx``), a reopen (list; the ``.idx`` copies are reused), and the floors
    any reader pays: the bare listing (``fs.find`` of the prefix, with sizes and ETags), and the same
    ``.idx`` files fetched with one GET each, as many in flight as the open keeps."""
    import os
    import subprocess

    import s3fs

    from lightning_tune_data.cache.root import StoreRoot

    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "serve", str(files)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        options = {"endpoint_url": f"http://127.0.0.1:{int(process.stdout.readline())}", "key": "testing",
                   "secret": "testing"}
        manager = TokenizedDatasetManager("s3://corpus/mg/", format="megatron", storage_options=options)
        node = StoreRoot(str(root / "s3-node"), cache_budget=16 << 10)  # less than the corpus: read by ranges

        def fresh() -> None:
            s3fs.S3FileSystem.clear_instance_cache()  # a fresh listing each time, as a new process has

        def listing() -> None:
            fresh()
            s3fs.S3FileSystem(**options).find("corpus/mg/", detail=True)

        def reopen() -> None:
            fresh()
            manager.setup(None, node)

        def fetch_indexes() -> None:  # the floor: one GET per .idx (no HEAD first), as many in flight as the open
            fresh()
            pooled = s3fs.S3FileSystem(**options, max_concurrency=1,
                                       config_kwargs={"max_pool_connections": CONCURRENT_REQUESTS})
            pooled.cat([f"corpus/mg/part-{index:05d}.idx" for index in range(files)], batch_size=CONCURRENT_REQUESTS)

        fresh()
        start = time.perf_counter()
        corpus = manager.setup(None, node)
        first = time.perf_counter() - start
        assert type(corpus).__name__ == "RangedCorpus" and len(corpus.corpus.files) == files
        return {"first": first, "reopen": timed(reopen, repeats=2), "listing": timed(listing, repeats=2),
                "fetch": timed(fetch_indexes, repeats=1)}
    finally:
        process.terminate()
        process.wait(timeout=30)


def bench_ranged(root: Path, count: int) -> tuple[float, float, int]:
    """One pass over ``count`` documents of 4 Megatron pairs on the S3 stand-in, read by ranges of
    a 32nd of the corpus under a ``cache_budget`` of a quarter of the corpus (every range downloaded while
    reading), against one pass over the same files on local disk: tokens/s of each, and ranges."""
    import os
    import subprocess

    import boto3

    from lightning_tune_data.cache.root import StoreRoot
    from lightning_tune_data.formats import ranged

    docs = documents(count, seed=2)
    (root / "ranged").mkdir()
    for part in range(4):
        write_megatron_pair(root / "ranged" / f"part-{part}", docs[part::4])
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "serve", "0"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    try:
        endpoint = f"http://127.0.0.1:{int(process.stdout.readline())}"
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                              aws_secret_access_key="testing")
        for path in sorted((root / "ranged").iterdir()):
            client.put_object(Bucket="corpus", Key=f"ranged/{path.name}", Body=path.read_bytes())
        options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
        size = sum(path.stat().st_size for path in (root / "ranged").iterdir())
        ranged.RANGE_BYTES = max(4096, size // 32)  # 32 ranges (512 KiB for 20,000 documents)
        remote = TokenizedDatasetManager("s3://corpus/ranged/", storage_options=options).setup(
            None, StoreRoot(str(root / "ranged-node"), cache_budget=size // 4))
        local = TokenizedDatasetManager(str(root / "ranged")).setup(None, root / "node")
        tokens = int(sum(len(d) for d in docs))

        def one_pass(corpus) -> float:  # noqa: ANN001
            start = time.perf_counter()
            for sample in CorpusSource(corpus, "web", seed=5, num_passes=1):
                int(sample[INPUT_IDS].sum(dtype=np.int64))
            return tokens / (time.perf_counter() - start) / 1e6

        rates = [(one_pass(remote), one_pass(local)) for _ in range(2)]  # alternated; every remote pass downloads
        remote.close()
        return max(rate for rate, _ in rates), max(rate for _, rate in rates), remote.num_shards
    finally:
        ranged.RANGE_BYTES = 64 << 20
        process.terminate()
        process.wait(timeout=30)


def bench_throughput(root: Path, count: int) -> list[tuple[str, float, str]]:
    import datasets

    from tokenized_writers import write_datatrove, write_litdata

    docs = documents(count, seed=1)
    tokens = int(sum(len(d) for d in docs))
    (root / "mg").mkdir()
    for part in range(4):
        write_megatron_pair(root / "mg" / f"part-{part}", docs[part::4])
    order_docs = [d for part in range(4) for d in docs[part::4]]
    write_datatrove(root / "dt", "000.ds", order_docs)
    store = datasets.Dataset.from_dict({INPUT_IDS: [d.tolist() for d in order_docs]}).with_format(None)
    store = store.cast_column(INPUT_IDS, datasets.Sequence(datasets.Value("uint16")))
    store.save_to_disk(str(root / "store"))
    store = datasets.load_from_disk(str(root / "store"))
    megatron = TokenizedDatasetManager(str(root / "mg")).setup(None, root / "node")
    datatrove = TokenizedDatasetManager(str(root / "dt")).setup(None, root / "node")
    rows: list[int] = []

    def ours(corpus) -> None:
        source = CorpusSource(corpus, "web", seed=5)
        seen = [sample[SOURCE_ROW] for sample in itertools.islice(iter(source), count)]
        rows[:] = seen

    def sums(samples) -> None:
        for sample in itertools.islice(samples, count):
            int(sample[INPUT_IDS].sum(dtype=np.int64))

    results = []
    for name, action in [
        ("our store (ArrowSource, memory-mapped `datasets` store)", lambda: sums(iter(ArrowSource(store, "web", seed=5)))),
        ("Megatron files (CorpusSource)", lambda: sums(iter(CorpusSource(megatron, "web", seed=5)))),
        ("datatrove files (CorpusSource)", lambda: sums(iter(CorpusSource(datatrove, "web", seed=5)))),
    ]:
        results.append((name, timed(action), "shuffled"))
    ours(megatron)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import IndexedDataset
    indexed = [IndexedDataset(str(root / "mg" / f"part-{part}")) for part in range(4)]
    starts = np.concatenate([[0], np.cumsum([len(d) for d in indexed])])

    def megatron_reader() -> None:
        for row in rows:
            part = int(np.searchsorted(starts, row, side="right") - 1)
            int(np.asarray(indexed[part][row - int(starts[part])]).sum(dtype=np.int64))

    results.append(("Megatron-Core IndexedDataset, same rows in the same order", timed(megatron_reader), "shuffled"))
    write_litdata(root / "lt", order_docs, tokens_loader=False)
    from litdata import StreamingDataset

    def litdata_reader() -> None:
        for item in StreamingDataset(str(root / "lt")):  # iterated, as its DataLoader does (faster than indexing)
            int(np.asarray(item).sum(dtype=np.int64))

    results.append(("LitData StreamingDataset on its own chunks", timed(litdata_reader, repeats=2), "its own order"))
    return [(name, tokens / seconds / 1e6, order) for name, seconds, order in results]


def _open_rows(args: argparse.Namespace, local_open: float, s3: dict[str, float]) -> list[str]:
    overhead = s3["reopen"] - s3["listing"]
    return [
        "| open (`TokenizedDatasetManager.setup`, metadata only) | files | seconds | goal |",
        "|---|---|---|---|",
        f"| Megatron pairs, local | {args.files:,} .bin + {args.files:,} .idx | {local_open:.2f} | < 1 s |",
        f"| S3 stand-in, first open on an empty node (list, fetch every .idx; under `cache_budget`: no .bin "
        f"copied) | {args.s3_files:,} + {args.s3_files:,} | {s3['first']:.2f} | |",
        f"| floor: the bare listing, then one GET per .idx, {CONCURRENT_REQUESTS} in flight as in the open "
        f"(`s3fs.find`, then `s3fs.cat`, no HEAD) | {2 * args.s3_files:,} objects, {args.s3_files:,} fetched | "
        f"{s3['listing'] + s3['fetch']:.2f} ({s3['first'] / (s3['listing'] + s3['fetch']):.2f}x) | |",
        f"| S3 stand-in, reopen (list; the .idx copies reused) | {args.s3_files:,} + {args.s3_files:,} | "
        f"{s3['reopen']:.2f} | < 10 s |",
        f"| baseline: the bare listing of the same prefix (`s3fs.find`, sizes and ETags) | "
        f"{2 * args.s3_files:,} objects | {s3['listing']:.2f} | |",
        f"| reopen beyond the listing (ours) | | {overhead:.2f} ({s3['reopen'] / s3['listing']:.2f}x the listing) | |",
    ]


def run(ctx) -> list:  # noqa: ANN001 - run_all's Context
    """``run_all.py --only formats``: the open rows (1,000 files quick, 10,000 full; the S3 stand-in
    100 quick, 2,000 full: 10,000 is the standalone measured run) and the throughput rows (5,000 /
    20,000 documents)."""
    from common import Result

    files, s3_files, count = (1_000, 100, 5_000) if ctx.quick else (10_000, 2_000, 20_000)
    root = Path(tempfile.mkdtemp(prefix="bench-formats-"))
    try:
        local_open = bench_open(root, files)
        s3 = bench_open_s3(root, s3_files)
        rows = bench_throughput(root, count)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    base = rows[0][1]
    results = [
        Result("formats", f"open {files:,} Megatron pairs, local", "seconds", local_open, "s", target="< 1 s",
               met=local_open < 1.0),
        Result("formats", f"reopen {s3_files:,} Megatron pairs, S3 stand-in", "seconds", s3["reopen"], "s",
               "bare listing (same run)", s3["listing"], "< 10 s", s3["reopen"] < 10.0,
               f"first open on an empty node {s3['first']:.1f} s (the floor, listing and one GET per .idx "
               f"{CONCURRENT_REQUESTS} in flight: {s3['listing'] + s3['fetch']:.1f} s)"),
    ]
    results += [Result("formats", f"{name}, {order}", "M tokens/s", rate, "M tokens/s", "our store (same run)", base)
                for name, rate, order in rows[1:]]
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1_000)
    parser.add_argument("--s3-files", type=int, default=100)
    parser.add_argument("--documents", type=int, default=5_000)
    parser.add_argument("--output", type=Path, default=None, help="write the table here (e.g. results/formats.md)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-formats-"))
    local_open = bench_open(root, args.files)
    shutil.rmtree(root / f"open-{args.files}", ignore_errors=True)
    s3 = bench_open_s3(root, args.s3_files)
    rows = bench_throughput(root, args.documents) if args.documents else []
    by_ranges = bench_ranged(root, args.documents) if args.documents else None
    base = rows[0][1] if rows else 1.0
    lines = [
        "# Tokenized corpora in other formats",
        "",
        f"Command: `nice python benchmarks/bench_formats.py --files {args.files} --s3-files {args.s3_files} --documents "
        f"{args.documents}`; {platform.machine()}, Python {platform.python_version()}, {os.cpu_count()} CPUs shared "
        "with other jobs; files in the page cache, best of 3 (LitData and S3 reopen and listing: best of 2; the first "
        "S3 open: once). The S3 stand-in is moto's server in its own process on 127.0.0.1.",
        "",
        *_open_rows(args, local_open, s3),
        "",
    ]
    if rows:
        lines += [
            f"| reader ({args.documents:,} documents one at a time, every token summed) | order | M tokens/s | vs. our "
            "store |",
            "|---|---|---|---|",
            *[f"| {name} | {order} | {rate:.1f} | {rate / base:.2f} |" for name, rate, order in rows],
            "",
            "| one pass over the same documents, 4 Megatron pairs (CorpusSource) | M tokens/s | vs. local files |",
            "|---|---|---|",
            f"| on the S3 stand-in, by byte ranges ({by_ranges[2]} ranges) under a `cache_budget` of a quarter of "
            f"the corpus: every range downloaded during the pass | {by_ranges[0]:.1f} | {by_ranges[0] / by_ranges[1]:.2f} |",
            f"| the same files on local disk | {by_ranges[1]:.1f} | 1.00 |",
            "",
        ]
    if args.output is not None:
        args.output.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines), flush=True)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        _serve(int(sys.argv[2]))
    else:
        main()
