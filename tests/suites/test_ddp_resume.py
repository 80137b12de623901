"""Exact resume per rank under real DDP (2 CPU processes, gloo), and disjoint data across ranks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ddp_resume_fit.py"
CHECKPOINT_STEP, FINAL_STEP = 4, 10


def run_ddp(corpus: Path, run_dir: Path, num_workers: int, packing: str, ckpt_path: str | None = None) -> list[dict]:
    args = [sys.executable, str(SCRIPT), str(corpus), str(run_dir), str(FINAL_STEP), str(num_workers), packing]
    if ckpt_path:
        args.append(ckpt_path)
    result = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads((run_dir / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize(("num_workers", "packing"), [(0, "none"), (2, "best_fit")])
def test_ddp_resume_after_step_k_matches_uninterrupted_run_on_every_rank(corpus_dir, tmp_path, num_workers, packing):
    full = run_ddp(corpus_dir, tmp_path / "full", num_workers, packing)
    for rank_result in full:
        assert rank_result["global_step"] == FINAL_STEP
        assert len(rank_result["batches"]) == FINAL_STEP
    # Within a pass over a source the ranks read disjoint documents.
    documents = [{(s, e, tuple(t)) for batch in r["documents"] for s, e, t in batch} for r in full]
    assert documents[0] and documents[1]
    assert not documents[0] & documents[1]

    ckpt = next((tmp_path / "full" / "ckpt").glob(f"*step={CHECKPOINT_STEP}.ckpt"))
    resumed = run_ddp(corpus_dir, tmp_path / "resumed", num_workers, packing, str(ckpt))
    for rank, (want, got) in enumerate(zip(full, resumed)):
        assert got["batches"] == want["batches"][CHECKPOINT_STEP:], f"rank {rank} resumed on different data"
