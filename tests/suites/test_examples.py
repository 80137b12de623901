"""The runnable examples: ``examples/resume_demo.py`` run twice into the same output folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
