"""Shared pieces of the benchmark suite: synthetic data, datamodules, timing and results.

Nothing here is imported by the package or its tests. Data goes to a scratch directory
(``benchmarks/.data/`` by default, or ``--data-dir``), never into tracked files.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_DATA_DIR = BENCH_DIR / ".data"
RESULTS_DIR = BENCH_DIR / "results"

#: Token ids are drawn from the ByteTokenizer's byte range so TinyCausalLM (vocab 259) can train on them.
VOCAB = 256
MEAN_LEN = 300.0
SIGMA = 1.0


# --------------------------------------------------------------------------------- results
@dataclasses.dataclass
class Result:
    """One row of the results table.

    ``ratio`` is ``value / baseline_value`` (both in ``unit``; for latencies and memory a ratio
    below 1 is better, for throughput above 1). ``target`` is the target in words and
    ``met`` whether it holds (``None``: no target for this row).
    """

    benchmark: str
    config: str
    metric: str
    value: float
    unit: str
    baseline: str = ""
    baseline_value: float | None = None
    target: str = ""
    met: bool | None = None
    note: str = ""
    repeats: list[float] = dataclasses.field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        if self.baseline_value in (None, 0):
            return None
        return self.value / self.baseline_value


def fmt(x: float | None) -> str:
    """Compact human formatting: 3 significant digits, thousands separators for big numbers."""
    if x is None:
        return ""
    if isinstance(x, float) and not np.isfinite(x):
        return str(x)
    ax = abs(x)
    if ax >= 1000:
        return f"{x:,.0f}"
    if ax >= 100:
        return f"{x:.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def markdown_table(results: list[Result]) -> str:
    lines = [
        "| benchmark | configuration | metric | value | baseline | baseline value | ratio | target | met |",
        "|---|---|---|---:|---|---:|---:|---|---|",
    ]
    for r in results:
        met = "" if r.met is None else ("yes" if r.met else "**NO**")
        ratio = "" if r.ratio is None else f"{r.ratio:.3g}x"
        lines.append(
            f"| {r.benchmark} | {r.config} | {r.metric} ({r.unit}) | {fmt(r.value)} | {r.baseline} | "
            f"{fmt(r.baseline_value)} | {ratio} | {r.target} | {met} |"
        )
    return "\n".join(lines)


def write_csv(results: list[Result], path: Path) -> None:
    import csv

    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["benchmark", "config", "metric", "unit", "value", "baseline", "baseline_value", "ratio",
                         "target", "met", "repeats", "note"])
        for r in results:
            writer.writerow([r.benchmark, r.config, r.metric, r.unit, f"{r.value:.6g}", r.baseline,
                             "" if r.baseline_value is None else f"{r.baseline_value:.6g}",
                             "" if r.ratio is None else f"{r.ratio:.4g}", r.target,
                             "" if r.met is None else r.met, " ".join(f"{v:.4g}" for v in r.repeats), r.note])


def machine_info() -> dict[str, str]:
    import datasets
    import lightning
    import pyarrow
    import torch
    import torchdata

    try:
        import psutil

        memory = f"{psutil.virtual_memory().total / 2**30:.1f} GiB"
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except Exception:  # noqa: BLE001
        memory, load = "?", "?"
    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpus (os.cpu_count)": str(os.cpu_count()),
        "cpus usable (sched_getaffinity)": str(len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else "?",
        "cpu model": cpu,
        "memory": memory,
        "load average at start": load,
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "torch": torch.__version__,
        "datasets": datasets.__version__,
        "pyarrow": pyarrow.__version__,
        "lightning": lightning.__version__,
        "torchdata": torchdata.__version__,
    }


# --------------------------------------------------------------------------------- timing
def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def real_tokens(batch: dict[str, Any]) -> int:
    """The real (non-padding) tokens of one batch, from numbers the batch already holds.

    ``num_tokens`` (what the baselines and floors here return with their tensors), else the
    per-document ``tokens`` of our batches' provenance; the attention mask only when neither is
    there. Summing a ``[8, 2048]`` attention mask inside the timed loop cost ~20 us per batch here
    (its reduction code runs cold between batches), up to 8% of a packed batch: a cost of the
    measurement, not of the loader, and one that the blocks reader (no mask) never paid.
    """
    count = batch.get("num_tokens")
    if count is not None:
        return int(count)
    provenance = batch.get("provenance")
    if provenance is not None:
        return sum(provenance["tokens"])
    return int(batch["attention_mask"].sum())


def now() -> float:
    return time.perf_counter()


def collect() -> None:
    gc.collect()


# --------------------------------------------------------------------------------- data
def lognormal_lengths(n: int, mean: float = MEAN_LEN, sigma: float = SIGMA, seed: int = 0) -> np.ndarray:
    """Log-normal lengths with the given mean (``mu = log(mean) - sigma^2 / 2``), at least 2."""
    rng = np.random.default_rng(seed)
    mu = np.log(mean) - sigma**2 / 2
    return np.maximum(2, np.round(rng.lognormal(mu, sigma, n))).astype(np.int64)


def write_token_parquet(path: Path, num_docs: int, seed: int = 0) -> dict[str, Any]:
    """Write ``num_docs`` documents of random token ids (log-normal lengths) as ``input_ids`` list<int32>.

    Token ids are generated directly (no tokenizer): BOS (256) first, EOS (257) last, random bytes
    between. Returns a small description (documents, tokens, mean length).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta_path = path.with_suffix(".json")
    if path.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("num_docs") == num_docs and meta.get("seed") == seed:
            return meta
    path.parent.mkdir(parents=True, exist_ok=True)
    lengths = lognormal_lengths(num_docs, seed=seed)
    offsets = np.zeros(num_docs + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    rng = np.random.default_rng(seed + 1)
    values = rng.integers(0, VOCAB, size=int(offsets[-1]), dtype=np.int32)
    values[offsets[:-1]] = 256  # BOS
    values[offsets[1:] - 1] = 257  # EOS
    array = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
    table = pa.table({"input_ids": array})
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp, row_group_size=16_384, compression="snappy")
    os.replace(tmp, path)
    meta = {"num_docs": num_docs, "seed": seed, "tokens": int(offsets[-1]), "mean_len": float(lengths.mean())}
    meta_path.write_text(json.dumps(meta))
    return meta


def write_text_jsonl(path: Path, num_docs: int, seed: int = 0, mean_chars: int = 100) -> dict[str, Any]:
    """Write ``num_docs`` short ASCII documents (``{"text": ...}``) with uniform lengths around ``mean_chars``."""
    meta_path = path.with_suffix(".json")
    if path.exists() and meta_path.exists():
        meta = json.loads(meta_path.read_text())
        if meta.get("num_docs") == num_docs and meta.get("seed") == seed:
            return meta
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    words = ["the", "data", "stream", "resumes", "exactly", "where", "it", "stopped", "tokens", "pack",
             "a", "mixture", "of", "sources", "weights", "epoch", "batch", "loader", "worker", "cache"]
    lengths = rng.integers(mean_chars // 2, mean_chars * 3 // 2, size=num_docs)
    chars = 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as handle:
        for i, n in enumerate(lengths):
            picks = rng.integers(0, len(words), size=n // 4 + 1)
            text = " ".join(words[k] for k in picks)[:n]
            chars += len(text)
            handle.write(json.dumps({"text": text, "id": i}) + "\n")
    os.replace(tmp, path)
    meta = {"num_docs": num_docs, "seed": seed, "chars": chars}
    meta_path.write_text(json.dumps(meta))
    return meta


# --------------------------------------------------------------------------------- datamodules
SOURCE_WEIGHTS = {"web": 0.5, "code": 0.3, "books": 0.2}


def make_datamodule(
    parquet: Path,
    cache_dir: Path,
    interleaved: bool,
    packing: str | None,
    num_workers: int,
    batch_size: int,
    max_seq_len: int = 2048,
    seed: int = 0,
    **kwargs: Any,
):
    """A ``TextDataModule`` over the cached token Parquet file, prepared and set up.

    ``interleaved=False``: one source (``web``) over the file. ``interleaved=True``: three sources
    (``web``/``code``/``books``, weights 0.5/0.3/0.2) over the *same* file: they share one cache (the
    cache key does not depend on the source name) but each visits its rows in its own permutation.
    """
    from lightning_tune_data import LocalDatasetManager, TextDataModule

    names = list(SOURCE_WEIGHTS) if interleaved else ["web"]
    managers = {
        name: LocalDatasetManager(data_files=str(parquet), ds_type="parquet", preprocess_function=None,
                                  weight=SOURCE_WEIGHTS[name])
        for name in names
    }
    dm = TextDataModule(
        {"train": managers}, max_seq_len=max_seq_len, batch_size=batch_size, num_workers=num_workers,
        seed=seed, cache_dir=str(cache_dir), packing=packing, **kwargs,
    )
    dm.prepare_data()
    dm.setup("fit")
    return dm


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = now()
    out = fn()
    return now() - start, out


def parts_per_batch_us(make_batches: Callable[[], Any], parts: dict[str, tuple[object, str]], batches: int,
                       part_clock: Callable[[], int] = time.perf_counter_ns,
                       whole_clock: Callable[[], int] = time.perf_counter_ns) -> dict[str, float]:
    """µs per batch of each part (``name: (owner, attribute)``, a function or method wrapped with a
    ``part_clock`` timer) inside ``batches`` batches of the iterator ``make_batches()`` returns (made
    after the parts are wrapped, so every lookup finds the wrappers; 20 batches warm up first), and
    of the whole batch (``"whole"``, by ``whole_clock``); the parts are restored after. Each timed call
    adds about a microsecond of timer calls to its part."""
    spent = dict.fromkeys(parts, 0)
    originals = {name: (owner, attribute, getattr(owner, attribute)) for name, (owner, attribute) in parts.items()}

    def timed(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = part_clock()
            try:
                return method(*args, **kwargs)
            finally:
                spent[name] += part_clock() - start
        return wrapper

    for name, (owner, attribute, method) in originals.items():
        setattr(owner, attribute, timed(name, method))
    try:
        iterator = make_batches()
        for _ in range(20):
            next(iterator)
        for name in spent:
            spent[name] = 0
        start = whole_clock()
        for _ in range(batches):
            next(iterator)
        whole = whole_clock() - start
    finally:
        for owner, attribute, method in originals.values():
            setattr(owner, attribute, method)
    return {**{name: value / batches / 1e3 for name, value in spent.items()}, "whole": whole / batches / 1e3}


def package_at(commit: str, target: Path) -> Path:
    """The package as of git ``commit``, extracted into ``target`` once (reused while it is whole)."""
    if not (target / "lightning_tune_data" / "__init__.py").exists():
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[1]), "archive", commit,
                                  "lightning_tune_data"], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target
