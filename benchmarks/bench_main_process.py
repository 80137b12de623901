"""What the main process pays per batch, and the batches it receives per second, at 0 and 2 workers.

With dataloader workers the main process runs the training step and receives every batch, so what
receiving costs it is taken from the step. For three configurations (``max_seq_len`` 2048):

| configuration | batch |
|---|---|
| `unpacked` (one source, `PaddedCollator`) | 16 |
| `best_fit` over 3 interleaved sources (`PackedCollator`) | 8 |
| `concat` (one source) | 8 |

each measurement iterates ``train_dataloader()`` (the real loader: ``ResumableLoader`` around the
train ``StatefulDataLoader``, the state recorded after every batch) for a fixed time after 5
warm-up batches and records the main process's CPU time (``getrusage(RUSAGE_SELF)``: all its
threads, not the workers) per batch and the batches (and real tokens) delivered per second:

* **today's**: the package as of ``BASE_COMMIT`` (extracted with ``git archive`` into
  ``<data-dir>/base-<commit>``), at 0 workers (the in-process production cost) and 2 workers;
* **ours**: this checkout at 0 workers (full batches, what a loop without a Trainer gets; compact;
  compact and expanded on the host), section 9's blocks reader in the same process, and at 2 workers with compact batches (what a Trainer's loader hands out; ``compact_batches=True``)
  received as they are, received and expanded on the host (``expand_batch``: the model-ready
  batch of a CPU run; on a GPU run the expansion runs on the device), and with full batches
  (``compact_batches=False``); and at 0 workers compact and expanded in the same process.

Each version runs in its own process per configuration (per repeat in a quick run), the two versions
alternated configuration by configuration (repeat by repeat in a quick run); figures are medians
over the repeats. Run on its own:
``python benchmarks/run_all.py --only main_process [--quick]``.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Result, log, package_at  # noqa: E402

REPO_DIR = Path(__file__).resolve().parents[1]
#: The package before compact batches and lazily built worker states ("today's" in the table).
BASE_COMMIT = "5a652e9"
CONFIGS = {"unpacked": (False, None, 16), "best_fit": (True, "best_fit", 8), "concat": (False, "concat", 8)}
WARMUP = 5
#: Measurements per version: (name, workers, compact, expand); "base" runs only the first kind.
BASE_RUNS = [("w0", 0, None, False), ("w2", 2, None, False)]
OUR_RUNS = [("blocks", 0, None, False), ("w0", 0, False, False), ("w0 compact", 0, True, False),
            ("w0 compact+expand", 0, True, True), ("w2 compact", 2, True, False), ("w2 compact+expand", 2, True, True),
            ("w2 full", 2, False, False)]
#: What a quick run leaves out (to stay near a minute and a half on 2 cores).
QUICK_SKIPS = {"w2 full"}
GOAL_US = 300.0


def base_package(data_dir: Path) -> Path:
    """The package as of ``BASE_COMMIT``, extracted from git once."""
    return package_at(BASE_COMMIT, data_dir / f"base-{BASE_COMMIT}")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(spec: dict) -> dict:
    """In a fresh process: every run of the given configurations for one version (module docstring);
    ``{config: {run: figures}}``."""
    import warnings

    warnings.filterwarnings("ignore")
    return {config: _measure_config(spec, config) for config in spec["configs"]}


def _measure_config(spec: dict, config: str) -> dict:
    import common

    interleaved, packing, batch_size = CONFIGS[config]
    out = {}
    for name, workers, compact, expand in spec["runs"]:
        dm = common.make_datamodule(Path(spec["parquet"]), Path(spec["cache_dir"]), interleaved, packing, workers,
                                    batch_size)
        if name == "blocks":
            out[name] = _blocks_reader(dm, spec, batch_size)
            continue
        expand_batch = None
        if compact is not None:
            from lightning_tune_data.collate import PackedCollator, PaddedCollator, expand_batch

            cls = PackedCollator if packing else PaddedCollator
            dm.train_collator = lambda cls=cls, compact=compact: cls(pad_id=dm.tokenizer.pad_id, max_seq_len=2048,
                                                                     compact=compact)
        loader = dm.train_dataloader()
        batches = iter(loader)
        for _ in range(WARMUP):
            next(batches)
        count = tokens = 0
        cpu0, start = _cpu(), time.perf_counter()
        while time.perf_counter() - start < spec["seconds"]:
            batch = next(batches)
            if expand:
                batch = expand_batch(batch)
            tokens += sum(batch["provenance"]["tokens"])
            count += 1
        cpu, wall = _cpu() - cpu0, time.perf_counter() - start
        loader._iterator = None  # stops the workers
        out[name] = {"cpu_us": cpu / count * 1e6, "batches_s": count / wall, "tokens_s": tokens / wall, "batches": count,
                     "package": str(Path(sys.modules["lightning_tune_data"].__file__).parent)}
    return out


def _blocks_reader(dm, spec: dict, batch_size: int) -> dict:
    """Section 9's blocks reader (random ``[B, 2049]`` windows of the flat tokens), CPU per batch."""
    import bench_hotpath

    flat = bench_hotpath.flat_tokens(dm.dataset("train", next(iter(dm.dataset_managers["train"]))),
                                     Path(spec["cache_dir"]).parent / f"flat_tokens_{Path(spec['parquet']).stem}.npy")
    reader = bench_hotpath.BlocksReader(flat, batch_size, seed=0)
    for _ in range(WARMUP):
        next(reader)
    count, cpu0, start = 0, _cpu(), time.perf_counter()
    while time.perf_counter() - start < spec["seconds"]:
        next(reader)
        count += 1
    wall = time.perf_counter() - start
    return {"cpu_us": (_cpu() - cpu0) / count * 1e6, "batches_s": count / wall, "tokens_s": count * batch_size * 2048 / wall,
            "batches": count}


def _run_version(spec: dict, package: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(package), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, str(Path(__file__).resolve()), "measure", json.dumps(spec)], env=env,
                            capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"bench_main_process: {spec['configs']} failed:\n{result.stderr[-3000:]}")
    line = [x for x in result.stdout.splitlines() if x.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def run(ctx) -> list[Result]:
    seconds = 0.4 if ctx.quick else 1.5
    repeats = 2 if ctx.quick else max(2, ctx.repeats)
    base = base_package(ctx.data_dir)
    samples: dict[tuple[str, str, str], list[dict]] = {}
    # A full run alternates the versions configuration by configuration; a quick one repeat by repeat
    # (one process per version and repeat: interpreter start-up is most of a quick run).
    groups = [list(CONFIGS)] if ctx.quick else [[config] for config in CONFIGS]
    ours = [run for run in OUR_RUNS if not (ctx.quick and run[0] in QUICK_SKIPS)]
    for repeat in range(repeats):
        for configs in groups:
            spec = {"configs": configs, "seconds": seconds, "parquet": str(ctx.token_parquet),
                    "cache_dir": str(ctx.cache_dir)}
            versions = [("base", base, BASE_RUNS), ("ours", REPO_DIR, ours)]
            for version, package, runs in versions if repeat % 2 == 0 else versions[::-1]:
                for config, figures_by_run in _run_version({**spec, "runs": runs}, package).items():
                    for name, figures in figures_by_run.items():
                        samples.setdefault((version, config, name), []).append(figures)
            log(f"main_process: repeat {repeat + 1}/{repeats} {', '.join(configs)} done")
    return results_of(samples, seconds, repeats)


def _median(samples: dict, key: tuple[str, str, str], figure: str) -> float:
    return statistics.median(sample[figure] for sample in samples[key])


def results_of(samples: dict, seconds: float, repeats: int) -> list[Result]:
    """The table's rows from the medians of the repeats."""
    results = []
    how = f"{seconds:g} s per run after {WARMUP} warm-up batches, median of {repeats}; load {os.getloadavg()[0]:.1f}"
    for config in CONFIGS:
        def cpu(version: str, name: str) -> float:
            return _median(samples, (version, config, name), "cpu_us")

        def rate(version: str, name: str) -> float:
            return _median(samples, (version, config, name), "batches_s")

        made = cpu("ours", "w0")
        rows = [
            Result("main_process", config, "main CPU/batch, 2 workers, compact batches received", cpu("ours", "w2 compact"),
                   "us", "in-process production (0 workers, full batch)", made, f"<= {GOAL_US:g} us",
                   cpu("ours", "w2 compact") <= GOAL_US, how),
            Result("main_process", config, "main CPU/batch, 2 workers, received + expanded on the host",
                   cpu("ours", "w2 compact+expand"), "us", "in-process production (0 workers, full batch)", made),
            ("w2 full", lambda: Result("main_process", config, "main CPU/batch, 2 workers, full batches "
                                       "(compact_batches=False)", cpu("ours", "w2 full"), "us", "today's, 2 workers",
                                       cpu("base", "w2"))),
            Result("main_process", config, "main CPU/batch, 2 workers, today's", cpu("base", "w2"), "us",
                   "today's in-process production (0 workers)", cpu("base", "w0")),
            Result("main_process", config, "main CPU/batch, 0 workers (in-process production)", made, "us",
                   "today's, 0 workers", cpu("base", "w0")),
            ("w0 compact+expand", lambda: Result("main_process", config, "main CPU/batch, 0 workers, compact + "
                                                 "expanded in-process", cpu("ours", "w0 compact+expand"), "us",
                                                 "ours, 0 workers, full batch", made)),
            Result("main_process", config, "delivered batches/s, 2 workers, compact", rate("ours", "w2 compact"),
                   "batches/s", "today's, 2 workers", rate("base", "w2"), ">= 2x",
                   rate("ours", "w2 compact") >= 2 * rate("base", "w2"),
                   f"{_median(samples, ('ours', config, 'w2 compact'), 'tokens_s') / 1e6:.1f} M tokens/s"),
            Result("main_process", config, "delivered batches/s, 2 workers, model-ready on the host",
                   rate("ours", "w2 compact+expand"), "batches/s", "today's, 2 workers", rate("base", "w2")),
            ("w2 full", lambda: Result("main_process", config, "delivered batches/s, 2 workers, full batches",
                                       rate("ours", "w2 full"), "batches/s", "today's, 2 workers", rate("base", "w2"))),
            Result("main_process", config, "delivered batches/s, 0 workers", rate("ours", "w0"), "batches/s",
                   "today's, 0 workers", rate("base", "w0")),
            # in-process, the loader's output against section 9's blocks reader (CPU time per batch: ratio = blocks / ours)
            ("blocks", lambda: Result("main_process", config, "in-process loader output, compact: blocks reader's CPU/batch "
                                      "over ours", cpu("ours", "blocks") / cpu("ours", "w0 compact"), "x",
                                      "the same with full batches", cpu("ours", "blocks") / made,
                                      note=f"blocks reader {cpu('ours', 'blocks'):.0f} us/batch of {CONFIGS[config][2]} "
                                           "rows; goals of section 9: concat >= 0.5x, best_fit >= 0.3x")),
            ("blocks", lambda: Result("main_process", config, "in-process model-ready (compact + expanded on the host): "
                                      "blocks reader's CPU/batch over ours",
                                      cpu("ours", "blocks") / cpu("ours", "w0 compact+expand"), "x",
                                      "the same with full batches", cpu("ours", "blocks") / made)),
        ]
        for row in rows:
            if isinstance(row, Result):
                results.append(row)
            elif ("ours", config, row[0]) in samples:  # a run a quick run leaves out
                results.append(row[1]())
    return results


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "measure":
        print("RESULT " + json.dumps(measure(json.loads(sys.argv[2]))), flush=True)
    else:
        raise SystemExit("usage: run it through run_all.py --only main_process (this module's 'measure' mode is "
                         "its worker process)")
