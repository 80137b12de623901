"""Benchmark 13: a remote store larger than ``cache_budget``, read through the node shard cache.

Data: ``common.write_token_parquet`` documents (log-normal lengths, token ids, no tokenizer;
85k documents, ~100 MB of tokens full; 8.5k, ~10 MB quick) prepared with a ``shard_size`` that
gives the store >= 64 shards (1 MB full, 100 KB quick: shards close at the first record batch
past the size, so they come out ~1.5x it). ``prepare_data()`` with an ``s3://`` ``cache_dir``
uploads it to moto's S3 server; the same documents are also prepared into a local ``cache_dir``
(the local-disk store, the baseline).

The S3 stand-in is moto's server in its own process on 127.0.0.1 (``python bench_node_cache.py
server``), reached with s3fs and ``endpoint_url``. Its WSGI app is wrapped to count the bytes of
every GET of a shard it serves (``/__counts__`` returns them): the bytes downloaded by every
process of the node, whatever process or thread asked. A server in its own process keeps its CPU
(and GIL) out of the reading process, as a real S3 would; on this 2-core machine it still takes
CPU from the readers while it serves.

Rows (every baseline measured in the same run; ours and the baselines alternated within each
repeat):

1. Steady throughput (tokens/s of ``train_dataloader()`` batches, ``max_seq_len`` 2048; unpacked
   batch 16 and ``best_fit`` batch 8; ``num_workers`` 0 and 2) of four readers, each one
   iterator kept across the repeats (so the budgeted one keeps walking new windows) and
   measured for ``throughput_budget_s`` per repeat after a warm-up: the local-disk store
   (baseline); S3 with ``cache_budget`` holding the whole store (the store is then *copied whole*
   to ``local_cache_dir`` and memory-mapped like a local store: warm after the first run);
   S3 with a budget of 97 % of the store (read windowed, shard by shard; almost every shard stays
   cached, so this isolates the windowed read path from downloading); S3 with a budget of 25 % of
   the store (windowed, default ``shuffle_window``: what an eighth of the budget holds;
   every pass downloads the store). Goal >= 0.8x of the local-disk store.
2. Cold first-batch latency: fresh ``local_cache_dir``, a new ``TextDataModule``'s
   ``prepare_data()`` + ``setup("fit")`` + ``train_dataloader()`` + first batch, budget 25 %,
   against the same with no budget (the whole store downloaded first). Bytes the server sent
   until the first batch against the first window's shards.
3. Bytes downloaded per pass: fresh ``local_cache_dir``, budget 25 % (4 windows), unpacked, read
   for exactly two passes of documents (``2 x rows``); the server's shard GET bytes / 2 against
   the store's bytes (a pass reads every shard once). Goal <= 1.1x.
4. Peak local disk use during row 3 (a thread sums the allocated blocks of the files under the
   node's shard cache folder, partial downloads and deleted files still mapped by any process
   included, every 20 ms) against the budget.
5. Shuffle locality (pure computation, no I/O): for one pass of the windowed order at the 25 %
   budget's window and at 1 shard per window, against the full shuffle (``KeyedPermutation``),
   the median and mean ``|row distance|`` between consecutive documents of the pass, and the
   share of consecutive pairs from the same shard.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
BUCKET = "bench-node-cache"
SOURCE = "web"
SEED = 0
WARMUP_BATCHES = 3
CONFIGS = [("unpacked", None, 16), ("best_fit", "best_fit", 8)]  # name, packing, batch size
QUIET_ENV = {"HF_DATASETS_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1", "PYTHONWARNINGS": "ignore"}


# ============================================================================ the S3 stand-in (subprocess)
def _serve() -> None:
    """moto's S3 server on 127.0.0.1 (a free port, printed first), counting the shard bytes it sends."""
    import logging

    from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    counts = {"shard_get_bytes": 0, "shard_gets": 0, "get_bytes": 0}
    lock = threading.Lock()
    inner = DomainDispatcherApplication(create_backend_app)

    def app(environ, start_response):  # noqa: ANN001, ANN202
        path = environ.get("PATH_INFO", "")
        if path == "/__counts__":
            with lock:
                body = json.dumps(counts).encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        result = inner(environ, start_response)
        if environ.get("REQUEST_METHOD") != "GET":
            return result
        chunks = list(result)
        if hasattr(result, "close"):
            result.close()
        sent = sum(map(len, chunks))
        with lock:
            counts["get_bytes"] += sent
            if "/shards/" in path:
                counts["shard_get_bytes"] += sent
                counts["shard_gets"] += 1
        return chunks

    server = make_server("127.0.0.1", 0, app, threaded=True, request_handler=MotoRequestHandler)
    print(server.server_port, flush=True)
    server.serve_forever()


class MotoProcess:
    """moto's S3 server in a child process, with one bucket and a count of the shard bytes served."""

    def __enter__(self) -> MotoProcess:
        import boto3

        env = {**os.environ, **QUIET_ENV}
        self.process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "server"],
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        port = int(self.process.stdout.readline())
        self.endpoint = f"http://127.0.0.1:{port}"
        self.options = {"endpoint_url": self.endpoint, "key": "testing", "secret": "testing"}
        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket=BUCKET)
        return self

    def counts(self) -> dict[str, int]:
        with urllib.request.urlopen(f"{self.endpoint}/__counts__") as response:
            return json.loads(response.read())

    def shard_bytes(self) -> int:
        return self.counts()["shard_get_bytes"]

    def __exit__(self, *exc: Any) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


# ============================================================================ helpers
def _datamodule(parquet: Path, cache_dir: str, packing: str | None, batch_size: int, num_workers: int,
                shard_size: str, **kwargs: Any):
    from lightning_tune_data import LocalDatasetManager, TextDataModule

    managers = {SOURCE: LocalDatasetManager(data_files=str(parquet), ds_type="parquet", preprocess_function=None)}
    kwargs.setdefault("build_stores", "if_missing")  # the first run writes the S3 store from this process
    return TextDataModule({"train": managers}, max_seq_len=2048, batch_size=batch_size, num_workers=num_workers,
                          seed=SEED, cache_dir=cache_dir, packing=packing, shard_size=shard_size, **kwargs)


def _ready(dm):
    dm.prepare_data()
    dm.setup("fit")
    return dm


def _folder_bytes(folder: Path) -> int:
    """What the disk holds for the folder: allocated blocks, with deleted files still mapped."""
    from lightning_tune_data.cache.sizes import allocated_size

    return allocated_size(folder)[0]


class DiskPeak:
    """A thread that samples the bytes of the files under ``folder`` every ``interval`` seconds."""

    def __init__(self, folder: Path, interval: float = 0.02) -> None:
        self.folder, self.interval, self.peak, self.samples = folder, interval, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, _folder_bytes(self.folder))
            self.samples += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> DiskPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _folder_bytes(self.folder))


def _drain(it, budget_s: float) -> tuple[float, int, float]:
    """Batches of ``it`` for ``budget_s`` seconds: (wall seconds, real tokens, CPU seconds of this process)."""
    from common import real_tokens

    tokens = 0
    c0, t0 = time.process_time(), time.perf_counter()
    while True:
        tokens += real_tokens(next(it))
        elapsed = time.perf_counter() - t0
        if elapsed >= budget_s:
            return elapsed, tokens, time.process_time() - c0


def locality(order: np.ndarray, shard_starts: np.ndarray) -> dict[str, float]:
    """How far apart consecutive documents of a pass lie in the source (rows), and the share of
    consecutive pairs from the same shard."""
    distance = np.abs(np.diff(order))
    shard = np.searchsorted(shard_starts, order, side="right") - 1
    return {"median": float(np.median(distance)), "mean": float(distance.mean()),
            "same_shard": float(np.mean(shard[1:] == shard[:-1]))}


# ============================================================================ the benchmark
def run(ctx) -> list:
    import common
    from common import Result, log, median

    docs = ctx.store_open_docs[0]
    shard_size = "100KB" if ctx.quick else "1MB"
    root = ctx.data_dir / "node_cache"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    parquet = ctx.data_dir / f"node_cache_tokens_{docs}.parquet"
    meta = common.write_token_parquet(parquet, docs)
    results: list = []
    with MotoProcess() as s3:
        url = f"s3://{BUCKET}/store"
        s3kw = {"storage_options": s3.options}

        def remote(name: str, packing=None, batch=16, workers=0, **kwargs: Any):
            return _datamodule(parquet, url, packing, batch, workers, shard_size, local_cache_dir=str(root / name),
                               **s3kw, **kwargs)

        def local(packing=None, batch=16, workers=0):
            return _datamodule(parquet, str(root / "local"), packing, batch, workers, shard_size)

        t0 = time.perf_counter()
        _ready(local())
        _ready(remote("upload"))  # builds the store in upload/ and uploads it
        t_prep = time.perf_counter() - t0
        shard_files = sorted((root / "local").glob(f"{SOURCE}-*/shards/*/*.arrow"))
        store_bytes = sum(f.stat().st_size for f in shard_files)
        budgets = {"25%": store_bytes // 4, "97%": int(store_bytes * 0.97)}
        store = _ready(remote("probe", cache_budget=budgets["25%"])).dataset("train", SOURCE)
        assert store.size == store_bytes and store.num_shards == len(shard_files), (store, store_bytes)
        window = store.window
        sizes = np.array([int(entry["size"]) for entry in store.shards], dtype=np.int64)
        log(f"node_cache: {docs:,} docs, {meta['tokens']:,} tokens, {store.num_shards} shards "
            f"({sizes.min() / 1e6:.2f}-{sizes.max() / 1e6:.2f} MB, {store_bytes / 1e6:.1f} MB); local + S3 stores "
            f"ready in {t_prep:.1f}s; 25% budget {budgets['25%'] / 1e6:.1f} MB -> window {window} rows")
        what = (f"{docs:,} docs, {store_bytes / 1e6:.0f} MB in {store.num_shards} shards of "
                f"{np.median(sizes) / 1e6:.2g} MB (max {sizes.max() / 1e6:.2g})")
        orders = {"1 reader": store.order}
        for workers in ctx.worker_counts:
            if workers > 1:
                probe = _ready(remote(f"probe-{workers}", workers=workers, cache_budget=budgets["25%"]))
                orders[f"{workers} readers ({workers} workers)"] = probe.dataset("train", SOURCE).order
        floor = _network_floor(s3, store, url)
        log(f"node_cache: plain GETs of every shard, {floor['threads']} at once: {floor['bytes_per_s'] / 1e6:.0f} MB/s")
        store_tokens = sum(int(entry.get("tokens") or 0) for entry in store.shards) or meta["tokens"]
        results += _throughput(ctx, remote, local, budgets, store_bytes, what, s3, Result, log, median, floor,
                               store_tokens)
        results += _cold(ctx, remote, budgets, store, sizes, what, s3, root, Result, log, median)
        results += _per_pass(ctx, remote, budgets, store, sizes, what, s3, root, Result, log)
    results += _locality(store, orders, what, Result)
    shutil.rmtree(root, ignore_errors=True)
    return results


READERS = [  # key, local_cache_dir, budget key (None: the local-disk store), label
    ("local", None, None, "local-disk store"),
    ("whole", "whole", "whole", "S3, budget >= store (copied whole, warm)"),
    ("97%", "w97", "97%", "S3, budget 97% of store (windowed, warm)"),
    ("25%", "w25", "25%", "S3, budget 25% of store (windowed, 4 windows)"),
]


def _rotated(items: list, rep: int) -> list:
    """``items`` in a different order every repeat (rotated, and reversed every other repeat)."""
    shift = rep % len(items)
    rotated = items[shift:] + items[:shift]
    return rotated[::-1] if rep % 2 else rotated


def _network_floor(s3, store, url: str, rounds: int = 2) -> dict[str, float]:
    """What the stand-in delivers: plain GETs of every shard of the store from the same server,
    as many at once as the node cache's prefetch threads (bytes/s, best of ``rounds`` rounds)."""
    from concurrent.futures import ThreadPoolExecutor

    import fsspec

    from lightning_tune_data.cache.prefetcher import PREFETCH_THREADS

    fs = fsspec.filesystem("s3", **{"client_kwargs": {"endpoint_url": s3.endpoint}, "key": "testing",
                                    "secret": "testing", "skip_instance_cache": True})
    base = store.cache.files.url().split("://", 1)[1].rstrip("/")
    paths = [f"{base}/{entry['path']}" for entry in store.shards]
    best = 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        with ThreadPoolExecutor(PREFETCH_THREADS) as pool:
            got = sum(len(data) for data in pool.map(fs.cat_file, paths))
        best = max(best, got / (time.perf_counter() - t0))
    return {"bytes_per_s": best, "threads": PREFETCH_THREADS}


def _throughput(ctx, remote, local, budgets, store_bytes, what, s3, Result, log, median, floor, tokens) -> list:
    results = []
    floor_tokens = floor["bytes_per_s"] * tokens / store_bytes  # tokens/s the stand-in can deliver
    budgets = {**budgets, "whole": store_bytes}
    for name, packing, batch in CONFIGS:
        for workers in ctx.worker_counts:
            dms = {}
            for key, folder, budget, _ in READERS:
                dms[key] = _ready(local(packing, batch, workers) if folder is None else
                                  remote(folder, packing, batch, workers, cache_budget=budgets[budget]))
            warm = dms["97%"].dataset("train", SOURCE)
            for shard in range(warm.num_shards):  # the 97% cache holds all but ~3% of the shards
                warm.cache.acquire(shard)
                warm.cache.release(shard)
            its = {key: iter(dm.train_dataloader()) for key, dm in dms.items()}
            for it in its.values():
                for _ in range(WARMUP_BATCHES):
                    next(it)
            rates: dict[str, list[float]] = {key: [] for key in dms}
            cpu: dict[str, list[float]] = {key: [] for key in dms}
            downloaded = {key: 0 for key in dms}
            read = {key: 0 for key in dms}  # tokens read during the measurements
            for rep in range(ctx.repeats):
                for key in _rotated(list(dms), rep):
                    before = s3.shard_bytes()
                    wall, drained, cpu_s = _drain(its[key], ctx.throughput_budget_s)
                    read[key] += drained
                    downloaded[key] += s3.shard_bytes() - before
                    rates[key].append(drained / wall)
                    cpu[key].append(drained / cpu_s if cpu_s else float("nan"))
                log(f"node_cache: {name} {workers}w repeat {rep + 1}: "
                    + ", ".join(f"{k} {v[-1] / 1e6:.2f}M tok/s" for k, v in rates.items()))
            del its
            common_collect()
            base = median(rates["local"])
            config = f"{name}, {workers} workers; {what}"
            for key, folder, budget, label in READERS[1:]:
                ratios = [a / b for a, b in zip(rates[key], rates["local"])]
                note = (f"per-repeat ratios {', '.join(f'{r:.2f}' for r in ratios)}; "
                        f"{downloaded[key] / 1e6:.1f} MB downloaded during the {ctx.repeats} measurements")
                if workers == 0:
                    note += (f"; tokens per CPU-second of the process {median(cpu[key]) / 1e6:.2f}M vs "
                             f"{median(cpu['local']) / 1e6:.2f}M local")
                if key == "whole":
                    note += "; a budget that holds the store copies it whole in prepare_data (no shard cache)"
                else:
                    passes = read[key] / tokens
                    per_pass = downloaded[key] / max(passes, 1e-9) / store_bytes
                    bound = floor_tokens / per_pass if per_pass > 0.05 else float("inf")
                    note += (f"; network floor: the stand-in delivers {floor['bytes_per_s'] / 1e6:.0f} MB/s "
                             f"({floor_tokens / 1e6:.1f}M tok/s) to {floor['threads']} plain GETs at once; "
                             f"downloading {per_pass:.2f}x the store a pass, the stand-in bounds this reader at "
                             f"{bound / 1e6:.1f}M tok/s, so it reads at {median(rates[key]) / bound:.2f}x that bound"
                             + (" (the download is the bound: the local-disk target cannot be met here)"
                                if bound < 0.8 * base else "")) if per_pass > 0.05 else (
                        f"; network floor: the stand-in delivers {floor['bytes_per_s'] / 1e6:.0f} MB/s to "
                        f"{floor['threads']} plain GETs at once (this reader downloads almost nothing)")
                results.append(Result("13 node cache", config, f"steady throughput, {label}", median(rates[key]),
                                      "tokens/s", "local-disk store", base, ">= 0.8x",
                                      median(rates[key]) / base >= 0.8, repeats=rates[key], note=note))
    return results


def common_collect() -> None:
    import gc

    gc.collect()


def _first_windows(store, sizes: np.ndarray):
    from lightning_tune_data.sources.permutation import permutation_key
    from lightning_tune_data.sources.windowed_order import WindowedPermutation

    from lightning_tune_data.sources.sharded_column import WindowReads

    order = WindowedPermutation(len(store), store.order["block_rows"], store.order["window_blocks"],
                                permutation_key(SEED, SOURCE, 0))
    reads = WindowReads(store, lambda epoch: order, [])
    order.first_shards = reads.shards_of_window(order, 0)
    return (order, int(sizes[order.first_shards].sum()),
            int(sizes[reads.shards_of_window(order, 1) if order.num_windows > 1 else []].sum()))


def _cold(ctx, remote, budgets, store, sizes, what, s3, root, Result, log, median) -> list:
    results = []
    _, first, second = _first_windows(store, sizes)
    cases = [("windowed", budgets["25%"]), ("whole", None)]
    for workers in ctx.worker_counts:
        seconds: dict[str, list[float]] = {key: [] for key, _ in cases}
        sent: dict[str, list[int]] = {key: [] for key, _ in cases}
        for rep in range(ctx.repeats):
            for key, budget in _rotated(cases, rep):
                folder = f"cold-{key}-{workers}-{rep}"
                before = s3.shard_bytes()
                t0 = time.perf_counter()
                dm = _ready(remote(folder, None, 16, workers, cache_budget=budget))
                it = iter(dm.train_dataloader())
                next(it)
                seconds[key].append(time.perf_counter() - t0)
                sent[key].append(s3.shard_bytes() - before)
                del it, dm
                common_collect()
                time.sleep(0.5)  # let a prefetch in flight finish before the next run counts bytes
                shutil.rmtree(root / folder, ignore_errors=True)
            log(f"node_cache: cold {workers}w repeat {rep + 1}: "
                + ", ".join(f"{k} {v[-1]:.2f}s {sent[k][-1] / 1e6:.1f} MB" for k, v in seconds.items()))
        value, base = median(seconds["windowed"]), median(seconds["whole"])
        results.append(Result(
            "13 node cache", f"cold start, unpacked, {workers} workers; {what}",
            "first batch (prepare_data + setup + loader + batch), S3 budget 25%", value, "s",
            "same, no budget (whole store downloaded first)", base, "waits for <= the first window",
            median(sent["windowed"]) <= first + second, repeats=seconds["windowed"],
            note=(f"shard bytes served until the first batch: {median(sent['windowed']) / 1e6:.2f} MB windowed "
                  f"(first window {first / 1e6:.2f} MB in {len(_first_windows(store, sizes)[0].first_shards)} shards, first two {(first + second) / 1e6:.2f} MB: "
                  f"the next window is fetched ahead while the first is read), {median(sent['whole']) / 1e6:.1f} MB "
                  f"whole (store {store.size / 1e6:.1f} MB, so the stand-in serves >= {store.size / 1e6 / base:.0f} MB/s); "
                  "'met' checks bytes served <= first two windows")))
    return results


def _per_pass(ctx, remote, budgets, store, sizes, what, s3, root, Result, log) -> list:
    from lightning_tune_data.keys import EPOCH

    results = []
    rows = len(store)
    order, first, _ = _first_windows(store, sizes)
    for workers in ctx.worker_counts:
        folder = f"pass-{workers}"
        dm = _ready(remote(folder, None, 16, workers, cache_budget=budgets["25%"]))
        read = dm.dataset("train", SOURCE)  # its windows are sized for the node's readers (the workers)
        cache_folder = read.cache.node_folder
        before = s3.shard_bytes()
        seen = 0
        at_pass_two = None
        pinned_ok = None
        t0 = time.perf_counter()
        with DiskPeak(cache_folder) as peak:
            for batch in dm.train_dataloader():
                provenance = batch["provenance"]
                if pinned_ok is None and workers == 0:  # the reader pins the shards it reads (prefetches are not pinned)
                    pinned = dm.dataset("train", SOURCE).pinned()
                    pinned_ok = bool(pinned) and set(pinned) <= set(order.first_shards)
                if at_pass_two is None and max(provenance[EPOCH]) >= 1:
                    at_pass_two = s3.shard_bytes() - before
                seen += len(provenance[EPOCH])
                if seen >= 2 * rows:
                    break
        elapsed = time.perf_counter() - t0
        total = s3.shard_bytes() - before
        per_pass = total / 2
        log(f"node_cache: 2 passes, {workers}w: {total / 1e6:.1f} MB in {elapsed:.1f}s, peak disk {peak.peak / 1e6:.1f} MB")
        blocks = read.order["window_blocks"]
        config = (f"unpacked, {workers} workers, budget 25% (windows of {blocks} block{'s' if blocks != 1 else ''} of "
                  f"{read.order['block_rows']:,} rows), 2 passes; {what}")
        results.append(Result(
            "13 node cache", config, "shard bytes downloaded per pass (server GET bytes / 2)", per_pass / 1e6, "MB",
            "store bytes (every shard read once a pass)", store.size / 1e6, "<= 1.5x", per_pass <= 1.5 * store.size,
            note=(f"until the first document of pass 2: {at_pass_two / 1e6 if at_pass_two else float('nan'):.1f} MB "
                  f"(includes pass 2's first window, fetched ahead); both passes {total / 1e6:.1f} MB in "
                  f"{elapsed:.1f}s; shards pinned at the first batch all in the computed first window: {pinned_ok}")))
        results.append(Result(
            "13 node cache", config, "peak local disk use (allocated blocks under the shard cache, deleted-but-mapped files included)",
            peak.peak / 1e6, "MB", "cache_budget", budgets["25%"] / 1e6, "<= budget + one shard",
            peak.peak <= budgets["25%"] + int(sizes.max()),
            note=(f"{peak.samples} samples every 20 ms; largest shard {sizes.max() / 1e6:.2f} MB; the whole-copy path keeps the store "
                  f"({store.size / 1e6:.1f} MB) on the node")))
        del dm
        common_collect()
        shutil.rmtree(root / folder, ignore_errors=True)
    return results


def _locality(store, orders, what, Result) -> list:
    from lightning_tune_data.sources.permutation import KeyedPermutation, permutation_key
    from lightning_tune_data.sources.windowed_order import WindowedPermutation

    rows = len(store)
    positions = np.arange(rows)
    key = permutation_key(SEED, SOURCE, 0)
    full = locality(KeyedPermutation(rows, key)(positions), store.shard_starts)
    results = []
    cases = {f"budget 25%, {label}": (order["block_rows"], order["window_blocks"]) for label, order in orders.items()}
    if (store.order["block_rows"], 1) not in cases.values():
        cases["one block a window"] = (store.order["block_rows"], 1)
    for label, (block, blocks) in cases.items():
        window = block * blocks
        windowed = locality(WindowedPermutation(rows, block, blocks, key)(positions), store.shard_starts)
        config = f"one pass of {rows:,} rows, windows of {blocks} blocks of {block:,} rows ({label}); {what}"
        for metric, field, unit in (("median |row distance| of consecutive documents", "median", "rows"),
                                    ("mean |row distance| of consecutive documents", "mean", "rows"),
                                    ("consecutive documents from the same shard", "same_shard", "share")):
            results.append(Result("13 node cache", config, f"shuffle locality: {metric}", windowed[field], unit,
                                  "full shuffle (KeyedPermutation)", full[field],
                                  note=(f"rows per shard {store.shard_rows.mean():.0f} (mean); a window holds "
                                        f"{window:,} rows of {rows:,}")
                                  if field == "median" else ""))
    return results


if __name__ == "__main__":
    if sys.argv[1:] == ["server"]:
        _serve()
