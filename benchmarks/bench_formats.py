"""Reading tokenized corpora in other tools' formats: open time, and document throughput against
our own store and against the tools' own readers, in the same run.

* **Open** a corpus of many small Megatron ``.bin``/``.idx`` pairs (``TokenizedDatasetManager.setup``:
  list, read every ``.idx``, check every ``.bin`` size): locally, and on the S3 stand-in (moto's
  server on 127.0.0.1, started here) for fewer files.
* **Throughput**: the same documents read one at a time in a shuffled order, as token arrays:
  our reader over Megatron and datatrove files (``CorpusSource``), our own store of the same
  documents (``ArrowSource`` over a memory-mapped ``datasets.Dataset``), Megatron-Core's
  ``IndexedDataset`` visiting the same rows in the same order, and LitData's ``StreamingDataset``
  over its own chunks of the same documents (its own order, unshuffled; no DataLoader).
  Every reader touches every token of every document it returns (a sum), so none is lazier.

Usage: python benchmarks/bench_formats.py [--files 10000] [--s3-files 100] [--documents 20000] [--output FILE]
(about a minute with these defaults on 2 CPUs)
"""

from __future__ import annotations

import argparse
import itertools
import platform
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from lightning_tune_data import ArrowSource, TokenizedDatasetManager  # noqa: E402
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


def bench_open_s3(root: Path, files: int) -> float:
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        endpoint = f"http://{host}:{port}"
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                              aws_secret_access_key="testing")
        client.create_bucket(Bucket="corpus")
        folder = root / "s3-source"
        folder.mkdir()
        docs = documents(4)
        for index in range(files):
            write_megatron_pair(folder / f"part-{index:05d}", docs)
            for suffix in (".bin", ".idx"):
                client.put_object(Bucket="corpus", Key=f"mg/part-{index:05d}{suffix}",
                                  Body=(folder / f"part-{index:05d}{suffix}").read_bytes())
        options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
        manager = TokenizedDatasetManager("s3://corpus/mg/", format="megatron", storage_options=options)
        manager.setup(None, root / "s3-node")  # the first open also copies the .bin files to the node
        import s3fs

        def reopen() -> None:
            s3fs.S3FileSystem.clear_instance_cache()  # a fresh listing each time, as a new process has
            manager.setup(None, root / "s3-node")

        return timed(reopen, repeats=2)
    finally:
        server.stop()



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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--s3-files", type=int, default=100)
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--output", type=Path, default=BENCH_DIR / "results" / "formats.md")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="bench-formats-"))
    local_open = bench_open(root, args.files)
    shutil.rmtree(root / f"open-{args.files}", ignore_errors=True)
    s3_open = bench_open_s3(root, args.s3_files)
    rows = bench_throughput(root, args.documents)
    base = rows[0][1]
    lines = [
        "# Tokenized corpora in other formats",
        "",
        f"Command: `python benchmarks/bench_formats.py --files {args.files} --s3-files {args.s3_files} --documents "
        f"{args.documents}`; {platform.machine()}, Python {platform.python_version()}; files in the page cache, "
        "best of 3 (LitData and S3: best of 2).",
        "",
        "| open (`TokenizedDatasetManager.setup`, metadata only) | files | seconds |",
        "|---|---|---|",
        f"| Megatron pairs, local | {args.files:,} .bin + {args.files:,} .idx | {local_open:.2f} |",
        f"| Megatron pairs, S3 stand-in (moto on 127.0.0.1) | {args.s3_files:,} .bin + {args.s3_files:,} .idx | "
        f"{s3_open:.2f} |",
        "",
        f"| reader ({args.documents:,} documents one at a time, every token summed) | order | M tokens/s | vs. our store |",
        "|---|---|---|---|",
        *[f"| {name} | {order} | {rate:.1f} | {rate / base:.2f} |" for name, rate, order in rows],
        "",
    ]
    args.output.write_text("\n".join(lines), encoding="utf-8")
    print("\n".join(lines), flush=True)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
