"""``benchmarks/run_all.py``: where results go, and the hint when psutil is missing."""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import run_all  # noqa: E402


def args(**overrides) -> argparse.Namespace:
    return argparse.Namespace(**{"out": None, "update_results": False, "data_dir": Path("scratch"), **overrides})


def test_results_go_to_the_scratch_folder_unless_update_results_or_out_is_given() -> None:
    assert run_all.output_stem(args(), quick=False) == Path("scratch") / "results" / "latest"
    assert run_all.output_stem(args(), quick=True) == Path("scratch") / "results" / "latest-quick"
    assert run_all.output_stem(args(update_results=True), quick=False) == REPO / "benchmarks" / "results" / "latest"
    assert run_all.output_stem(args(out=Path("x/y")), quick=True) == Path("x/y")


def test_missing_psutil_stops_with_the_install_hint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psutil", None)  # makes `import psutil` raise ImportError
    with pytest.raises(SystemExit, match=r'pip install -e "\.\[dev\]"'):
        run_all.main(["--quick", "--only", "packing"])


def test_quick_run_writes_outside_the_tracked_results(tmp_path: Path) -> None:
    tracked = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (REPO / "benchmarks" / "results").glob("*.*")}
    result = subprocess.run([sys.executable, str(REPO / "benchmarks" / "run_all.py"), "--quick", "--only", "packing",
                             "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| 5 packing | log-normal" in (tmp_path / "results" / "latest-quick.md").read_text()
    assert {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in (REPO / "benchmarks" / "results").glob("*.*")} == tracked


def test_both_readmes_give_the_same_suite_duration() -> None:
    readme = (REPO / "README.md").read_text()
    bench_readme = (REPO / "benchmarks" / "README.md").read_text()
    script = (REPO / "benchmarks" / "run_all.py").read_text()
    for text in (readme, bench_readme, script):
        assert "~10 min" in text  # the full suite, measured at 561-573 s
        assert "~11 min" not in text and "~3-5 min" not in text


def test_token_counts_read_from_each_batch_equal_its_attention_mask_sum(tmp_path: Path) -> None:
    import itertools

    import bench_hotpath
    from bench_throughput import SimplePadCollate
    from common import make_datamodule, real_tokens, write_token_parquet

    parquet = tmp_path / "tokens.parquet"
    write_token_parquet(parquet, 3000)
    for packing, batch_size in ((None, 16), ("concat", 8), ("best_fit", 8)):
        dm = make_datamodule(parquet, tmp_path / "cache", False, packing, 0, batch_size)
        for batch in itertools.islice(dm.train_dataloader(), 6):
            assert real_tokens(batch) == int(batch["attention_mask"].sum())
    dataset = dm._datasets["train"]["web"]
    flat = bench_hotpath.flat_tokens(dataset, tmp_path / "flat.npy")
    offsets = bench_hotpath.flat_offsets(dataset, tmp_path / "offsets.npy")
    readers = [bench_hotpath.BestFitFloor(flat, offsets, 8, 0), bench_hotpath.DocumentFloor(flat, offsets, 8, 0),
               bench_hotpath.PaddedFloor(flat, offsets, 16, 0)]
    for reader in readers:
        for batch in itertools.islice(reader, 6):
            assert real_tokens(batch) == int(batch["attention_mask"].sum())
    rows = [{"input_ids": list(range(n))} for n in (3, 9, 1, 2100)]
    batch = SimplePadCollate(2048)(rows)
    assert real_tokens(batch) == int(batch["attention_mask"].sum()) == 3 + 9 + 1 + 2048


def test_main_process_rows_compare_ours_with_todays_and_check_the_goals() -> None:
    import bench_main_process

    figures = {"cpu_us": 200.0, "batches_s": 100.0, "tokens_s": 1e6}
    samples = {}
    for config in bench_main_process.CONFIGS:
        for name, *_ in bench_main_process.BASE_RUNS:
            samples[("base", config, name)] = [{**figures, "cpu_us": 900.0, "batches_s": 40.0}]
        for name, *_ in bench_main_process.OUR_RUNS:
            if name not in bench_main_process.QUICK_SKIPS:
                samples[("ours", config, name)] = [dict(figures)]
    rows = bench_main_process.results_of(samples, 0.5, 1)
    assert len(rows) == 10 * len(bench_main_process.CONFIGS)  # a quick run leaves out the full batches from workers
    goals = [row for row in rows if row.target]
    assert [row.met for row in goals] == [True, True] * len(bench_main_process.CONFIGS)  # 200 us <= 300, 100 >= 2 x 40
    delivered = next(row for row in rows if row.metric == "delivered batches/s, 2 workers, compact")
    assert delivered.ratio == 2.5


def test_model_ready_rows_set_ours_against_the_blocks_reader_litdata_and_the_floors() -> None:
    import bench_model_ready

    names = ["blocks", "compact planes floor", "five planes floor", "litdata"]
    names += [f"{strategy} {kind}" for strategy in bench_model_ready.STRATEGIES for kind in ("compact", "model-ready", "full")]
    rates = {"blocks": 400.0, "compact planes floor": 600.0, "five planes floor": 200.0, "litdata": 150.0,
             "concat compact": 210.0, "concat model-ready": 160.0, "best_fit compact": 100.0}
    samples = {name: [(50.0, rates.get(name, 80.0))] for name in names}
    parts = dict.fromkeys(["block reading", "placement", "collation", "join of the rows", "state record", "whole",
                           "expansion"], 10.0)
    rows = bench_model_ready.results_of(samples, {strategy: parts for strategy in bench_model_ready.STRATEGIES},
                                        "0.2.76", 1, 10)
    goals = {row.config: (row.ratio, row.met) for row in rows if row.target}
    assert goals == {"concat, loader output (compact)": (0.525, True), "concat, model-ready on CPU (compact + expanded)":
                     (160 / 150, True), "best_fit, loader output (compact)": (0.25, False),
                     "best_fit, model-ready on CPU (compact + expanded)": (80 / 150, False)}
    without_litdata = bench_model_ready.results_of(samples, {s: parts for s in bench_model_ready.STRATEGIES}, None, 1, 10)
    assert any(row.metric == "not measured" for row in without_litdata)
    assert sum(row.target == ">= 1x" for row in without_litdata) == 0  # no peer: no model-ready goal to check
