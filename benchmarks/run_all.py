"""Run the benchmark suite and write ``latest.{md,csv}`` (``latest-quick.*`` with ``--quick``).

Needs the ``[dev]`` extra (``psutil`` measures memory): ``pip install -e ".[dev]"``.

Usage (from the repository root)::

    python benchmarks/run_all.py            # full suite (~10 min on 2 CPU cores)
    python benchmarks/run_all.py --quick    # smoke run with small sizes (~1-2 min)
    python benchmarks/run_all.py --only throughput,resume
    python benchmarks/run_all.py --update-results   # write the tracked benchmarks/results/ instead

Results go to ``benchmarks/.data/results/`` (ignored by git) unless ``--update-results`` or
``--out`` says otherwise, so a run never rewrites the committed results by accident.

Every figure is printed next to its baseline, measured in the same run, and their ratio. Rates
are medians of several repeats, and ours and the baselines are measured alternately within each
repeat, so that load from other processes on a shared machine hits both alike. See
``benchmarks/README.md`` for what each benchmark measures.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from common import RESULTS_DIR, log  # noqa: E402

PSUTIL_HINT = ('the benchmarks need psutil (memory measurements), which comes with the dev extra: '
               'pip install -e ".[dev]" (or pip install psutil)')


def require_psutil() -> None:
    """Fail early, with the install command, when ``psutil`` is missing."""
    try:
        import psutil  # noqa: F401
    except ImportError:
        raise SystemExit(f"run_all.py: {PSUTIL_HINT}") from None


def output_stem(args: argparse.Namespace, quick: bool) -> Path:
    """Where the results go: ``--out``, else the tracked results with ``--update-results``, else scratch."""
    name = "latest-quick" if quick else "latest"
    if args.out is not None:
        return args.out
    return (RESULTS_DIR if args.update_results else args.data_dir / "results") / name

BENCHMARKS = ["throughput", "resume", "memory", "prepare", "packing", "step"]

# --- hot-path, tokenizer, worker-memory and later benchmarks (bench_hotpath.py, bench_tokenize.py, ...): their module per name,
# their inputs (token data / text data) prepared like the others'.
EXTRA_BENCHMARKS = {"hotpath": "bench_hotpath", "tokenize": "bench_tokenize", "worker_memory": "bench_worker_memory",
                    "store": "bench_store", "node_cache": "bench_node_cache", "schedule": "bench_schedule",
                    "main_process": "bench_main_process", "model_ready": "bench_model_ready",
                    "formats": "bench_formats"}
BENCHMARKS += list(EXTRA_BENCHMARKS)
#: Run only when named in ``--only`` (several minutes on their own, outside the full suite's ~10 min).
ON_REQUEST = {"formats"}
TOKEN_DATA_BENCHMARKS = {"throughput", "resume", "memory", "step", "hotpath", "worker_memory", "schedule", "main_process",
                         "model_ready"}
TEXT_DATA_BENCHMARKS = {"prepare", "tokenize"}
# --- end


@dataclasses.dataclass
class Context:
    quick: bool
    data_dir: Path
    token_docs: int
    throughput_budget_s: float
    repeats: int
    resume_repeats: int
    memory_samples: int
    prepare_docs: int
    prepare_repeats: int
    packing_docs: int
    fit_steps: int
    worker_counts: tuple[int, ...] = (0, 2)
    # store (bench_store.py): text documents, subprocess repeats; token stores (docs) for reopening
    store_docs: int = 200_000
    store_repeats: int = 3
    store_open_docs: tuple[int, int] = (85_000, 340_000)
    store_open_repeats: int = 7
    store_rounds: int = 3
    store_small_shards: str = "1MB"
    token_parquet: Path | None = None
    token_meta: dict | None = None
    text_jsonl: Path | None = None
    text_meta: dict | None = None

    @property
    def cache_dir(self) -> Path:
        return self.data_dir / f"cache_{self.token_docs}"


def make_context(args: argparse.Namespace) -> Context:
    if args.quick:
        ctx = Context(quick=True, data_dir=args.data_dir, token_docs=20_000, throughput_budget_s=0.5, repeats=3,
                      resume_repeats=3, memory_samples=50_000, prepare_docs=20_000, prepare_repeats=1,
                      packing_docs=3_000, fit_steps=20, store_docs=20_000, store_repeats=1,
                      store_open_docs=(8_500, 34_000), store_open_repeats=5, store_rounds=2)
    else:
        ctx = Context(quick=False, data_dir=args.data_dir, token_docs=200_000, throughput_budget_s=2.0, repeats=3,
                      resume_repeats=5, memory_samples=1_000_000, prepare_docs=200_000, prepare_repeats=3,
                      packing_docs=20_000, fit_steps=60)
    for field in ("token_docs", "repeats", "memory_samples", "prepare_docs", "fit_steps", "store_docs", "store_repeats"):
        value = getattr(args, field)
        if value is not None:
            setattr(ctx, field, value)
    return ctx


def quiet() -> None:
    warnings.filterwarnings("ignore", message=".*set_vital.*")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "lightning_tune_data", "datasets"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import datasets

        datasets.disable_progress_bars()
        datasets.logging.set_verbosity_error()
    except Exception:  # noqa: BLE001
        pass


def prepare_inputs(ctx: Context, needed: set[str]) -> None:
    ctx.data_dir.mkdir(parents=True, exist_ok=True)
    if needed & TOKEN_DATA_BENCHMARKS:
        t0 = time.perf_counter()
        ctx.token_parquet = ctx.data_dir / f"tokens_{ctx.token_docs}.parquet"
        ctx.token_meta = common.write_token_parquet(ctx.token_parquet, ctx.token_docs)
        # build the cache once (prepare_data + setup) so the benchmarks only ever hit it
        common.make_datamodule(ctx.token_parquet, ctx.cache_dir, False, None, 0, 16)
        log(f"token data: {ctx.token_meta['num_docs']:,} docs, {ctx.token_meta['tokens']:,} tokens "
            f"(mean {ctx.token_meta['mean_len']:.1f}) ready in {time.perf_counter() - t0:.1f}s")
    if needed & TEXT_DATA_BENCHMARKS:
        ctx.text_jsonl = ctx.data_dir / f"text_{ctx.prepare_docs}.jsonl"
        ctx.text_meta = common.write_text_jsonl(ctx.text_jsonl, ctx.prepare_docs)


def header(ctx: Context, argv: list[str], info: dict[str, str], elapsed: float, load_end: str) -> str:
    lines = [
        f"# lightning_tune_data benchmarks ({'quick' if ctx.quick else 'full'})",
        "",
        f"Command: `{' '.join(['python benchmarks/run_all.py', *argv])}`",
        f"Finished {time.strftime('%Y-%m-%d %H:%M:%S')}, suite time {elapsed:.0f} s.",
        "",
        "| machine | |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v} |" for k, v in info.items()]
    lines.append(f"| load average at end | {load_end} |")
    lines += [
        "",
        "Sizes: "
        f"{ctx.token_docs:,} tokenized documents (log-normal lengths, mean ~300 tokens); throughput "
        f"{ctx.throughput_budget_s:g} s per measurement, median of {ctx.repeats}; resume median of "
        f"{ctx.resume_repeats}; memory run {ctx.memory_samples:,} samples; prepare_data {ctx.prepare_docs:,} "
        f"docs, median of {ctx.prepare_repeats}; packing {ctx.packing_docs:,} docs; fit {ctx.fit_steps} steps; "
        f"store {ctx.store_docs:,} text docs, median of {ctx.store_repeats}, reopened stores of "
        f"{ctx.store_open_docs[0]:,}/{ctx.store_open_docs[1]:,} token docs, {ctx.store_rounds} rounds x median of "
        f"{ctx.store_open_repeats} restarts.",
        "",
        "`ratio` = value / baseline value (both measured in this run). Rates are higher-is-better, "
        "latencies and memory lower-is-better. See benchmarks/README.md for definitions.",
        "",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    parser.add_argument("--only", default=",".join(b for b in BENCHMARKS if b not in ON_REQUEST),
                        help=f"comma-separated subset of {BENCHMARKS} (default: all but {sorted(ON_REQUEST)})")
    parser.add_argument("--data-dir", type=Path, default=common.DEFAULT_DATA_DIR,
                        help="scratch directory for generated data and caches (default benchmarks/.data)")
    parser.add_argument("--out", type=Path, default=None,
                        help="output stem (default <data-dir>/results/latest, or latest-quick with --quick)")
    parser.add_argument("--update-results", action="store_true",
                        help="write the tracked benchmarks/results/latest[-quick].{md,csv} (to commit them)")
    parser.add_argument("--token-docs", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--memory-samples", type=int, default=None)
    parser.add_argument("--prepare-docs", type=int, default=None)
    parser.add_argument("--fit-steps", type=int, default=None)
    parser.add_argument("--store-docs", type=int, default=None, help="text documents of the store benchmark")
    parser.add_argument("--store-repeats", type=int, default=None, help="repeats of the store benchmark's builds")
    args = parser.parse_args(argv)
    selected = [b.strip() for b in args.only.split(",") if b.strip()]
    unknown = sorted(set(selected) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {BENCHMARKS}")

    require_psutil()
    quiet()
    ctx = make_context(args)
    info = common.machine_info()
    start = time.perf_counter()
    prepare_inputs(ctx, set(selected))

    import bench_memory
    import bench_packing
    import bench_prepare
    import bench_resume
    import bench_step
    import bench_throughput

    modules = {"throughput": bench_throughput, "resume": bench_resume, "memory": bench_memory,
               "prepare": bench_prepare, "packing": bench_packing, "step": bench_step}
    modules.update({name: __import__(module) for name, module in EXTRA_BENCHMARKS.items()})  # hot path, tokenizer
    results: list[common.Result] = []
    for name in BENCHMARKS:
        if name not in selected:
            continue
        t0 = time.perf_counter()
        log(f"== {name}")
        results.extend(modules[name].run(ctx))
        log(f"== {name} done in {time.perf_counter() - t0:.0f}s")
    elapsed = time.perf_counter() - start
    load_end = ", ".join(f"{x:.2f}" for x in os.getloadavg())

    table = common.markdown_table(results)
    notes = [r for r in results if r.note]
    notes_md = "\n".join(f"- {r.benchmark} / {r.config} / {r.metric}: {r.note}" for r in notes)
    document = (header(ctx, argv, info, elapsed, load_end) + table + "\n\nNotes:\n\n" + notes_md + "\n")
    stem = output_stem(args, ctx.quick)
    stem.parent.mkdir(parents=True, exist_ok=True)
    md_path, csv_path = stem.with_suffix(".md"), stem.with_suffix(".csv")
    md_path.write_text(document)
    common.write_csv(results, csv_path)
    print(document)
    missed = [r for r in results if r.met is False]
    log(f"wrote {md_path} and {csv_path}; {sum(r.met is True for r in results)} targets met, {len(missed)} missed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
