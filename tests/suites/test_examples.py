"""The runnable examples: ``examples/resume_demo.py`` run twice into the same output folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_texts, write_jsonl

REPO = Path(__file__).resolve().parents[2]


def run_demo(output_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "examples" / "resume_demo.py"), "--output-dir", str(output_dir), "--num-workers", "0",
         "--max-seq-len", "64", *args],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=output_dir.parent,
    )


@pytest.mark.slow
def test_resume_demo_passes_when_invoked_again_into_the_same_output_folder(tmp_path: Path) -> None:
    output = tmp_path / "demo"
    for args in [("--packing", "concat"), ("--packing", "concat")]:  # every strategy's resume: test_resume.py
        result = run_demo(output, *args)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        assert "OK: all 10 batches after the resume are bitwise identical" in result.stdout
        assert "-v1" not in result.stdout


@pytest.mark.slow
def test_the_slurm_array_script_runs_each_array_task_and_the_last_commits(tmp_path: Path) -> None:
    for index in range(3):
        write_jsonl(tmp_path / "data" / f"part-{index}.jsonl", make_texts(12, seed=index, prefix=f"p{index}"))
    config = tmp_path / "cfg.yaml"
    config.write_text(
        "data:\n  max_seq_len: 64\n  cache_dir: cache\n  dataset_managers:\n    train:\n      notes:\n"
        "        class_path: lightning_tune_data.LocalDatasetManager\n"
        "        init_args: {data_files: data/part-*.jsonl}\n"
    )
    # the console script lives beside the interpreter; the array runs elements 1..2 (an offset array)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MIN": "1"}
    outputs = []
    for element in (2, 1):
        result = subprocess.run(["bash", str(REPO / "examples" / "prepare_slurm_array.sh"), str(config)],
                                env={**env, "SLURM_ARRAY_TASK_ID": str(element)}, cwd=tmp_path,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        outputs.append(result.stdout)
    assert "task 1 of 2: train/notes: written" in outputs[0] and "store committed" not in outputs[0]
    assert "task 0 of 2: train/notes: written" in outputs[1] and "store committed" in outputs[1]
    assert len(list((tmp_path / "cache").glob("notes-*/_COMPLETE.json"))) == 1
