"""Distributed reliability with real DDP (2 CPU ranks, gloo): an uneven filter cannot hang the
ranks, an indivisible val set is counted exactly once, a SIGKILLed run resumes exactly from its
last checkpoint, and the data state in checkpoints loads with ``torch.load(weights_only=True)``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from conftest import make_texts, write_jsonl
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_tune_data import DatasetMetricsCallback, LocalDatasetManager, TextDataModule
from lightning_tune_data.models import TinyCausalLM

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "reliability_ddp_fit.py"
VAL_TEXTS = [f"val doc {i} " + "z" * i for i in range(13)]  # 13 rows over 2 ranks


def run_script(*args: str, timeout: float = 240) -> None:
    result = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# -- an uneven filter and an indivisible val set ------------------------------------------
def run_uneven(corpus: Path, mode: str) -> list[dict]:
    # 2 ranks x 2 workers = 4 shards; unshuffled, shard s reads rows i with i % 4 == s, so rank 0
    # reads rows with i % 4 in (0, 1) and rank 1 rows with i % 4 in (2, 3). The filter keeps all
    # of rank 0's rows and only 1 in 5 of rank 1's.
    texts = [f"{'KEEP' if i % 4 < 2 or i % 20 < 4 else 'DROP'} row {i}" for i in range(200)]
    write_jsonl(corpus / "train.jsonl", texts)
    write_jsonl(corpus / "val.jsonl", VAL_TEXTS)
    run_dir = corpus / "run"
    run_dir.mkdir()
    run_script(mode, str(corpus), str(run_dir), timeout=180)  # a hang fails here
    return [json.loads((run_dir / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.fixture(scope="module")
def uneven_run(tmp_path_factory) -> list[dict]:
    return run_uneven(tmp_path_factory.mktemp("uneven"), "uneven")


@pytest.mark.slow
def test_a_filter_dropping_most_of_one_ranks_rows_still_reaches_max_steps_on_both_ranks(uneven_run):
    for rank in uneven_run:
        assert rank["global_step"] == 12 and len(rank["batches"]) == 12
    passes = [max(e for batch in rank["batches"] for e in batch["epochs"]) for rank in uneven_run]
    assert passes[0] == 0 and passes[1] >= 2, "rank 1 had to cycle its few kept rows several times"
    assert all(text.startswith("KEEP") for rank in uneven_run for batch in rank["batches"] for text in batch["texts"])


@pytest.mark.slow
def test_ranks_read_disjoint_rows_under_an_uneven_filter(uneven_run):
    rows = [{text for batch in rank["batches"] for text in batch["texts"]} for rank in uneven_run]
    assert rows[0] and rows[1] and not rows[0] & rows[1]
    assert all(int(text.split()[-1]) % 4 >= 2 for text in rows[1])


@pytest.mark.slow
def test_a_finite_stream_whose_data_ends_first_on_one_rank_ends_the_epoch_on_every_rank_together(tmp_path):
    # first_exhausted, one pass: rank 1 keeps 20 rows (2 workers x 2 batches of 4), rank 0 100.
    ranks = run_uneven(tmp_path, "uneven_finite")
    assert [r["global_step"] for r in ranks] == [4, 4]
    assert [len(r["batches"]) for r in ranks] == [4, 4]
    assert all(e == 0 for r in ranks for batch in r["batches"] for e in batch["epochs"])


@pytest.mark.slow
def test_val_metrics_count_every_sample_once_when_val_size_is_not_divisible_by_world_size(uneven_run):
    # Every val document is [BOS] bytes [EOS]; its shifted labels hold len(bytes) + 1 targets.
    expected_tokens = sum(len(text.encode()) + 1 for text in VAL_TEXTS)
    for rank in uneven_run:
        assert rank["val"]["val/heldout/docs"] == len(VAL_TEXTS)
        assert rank["val"]["val/heldout/tokens"] == expected_tokens


# -- preemption -----------------------------------------------------------------------------
REFERENCE_STEPS = 14


@pytest.fixture(scope="module")
def preemption(tmp_path_factory) -> dict:
    corpus = tmp_path_factory.mktemp("preempt")
    write_jsonl(corpus / "a.jsonl", make_texts(61, seed=1, prefix="A"))
    write_jsonl(corpus / "b.jsonl", make_texts(47, seed=2, prefix="B"))
    reference, killed, resumed = corpus / "reference", corpus / "killed", corpus / "resumed"
    run_script("preempt", str(corpus), str(reference), str(REFERENCE_STEPS), "0")

    # The run to kill sleeps 0.25 s per step; SIGKILL its whole process group (launcher, rank 1,
    # dataloader workers) once both ranks trained 9 batches, i.e. well after a checkpoint.
    process = subprocess.Popen([sys.executable, str(SCRIPT), "preempt", str(corpus), str(killed), "40", "0.25"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + 240
    try:
        while min(len(read_jsonl(killed / f"rank{r}.jsonl")) for r in (0, 1)) < 9:
            assert process.poll() is None, process.stderr.read()[-4000:]
            assert time.monotonic() < deadline, "the run to kill did not get to step 9"
            time.sleep(0.1)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    survivors_deadline = time.monotonic() + 30
    while any(str(killed) in " ".join(p.info["cmdline"] or []) for p in psutil.process_iter(["cmdline"])):
        assert time.monotonic() < survivors_deadline, "processes of the killed run survived"
        time.sleep(0.1)

    checkpoints = sorted((killed / "ckpt").glob("*.ckpt"), key=lambda p: int(p.stem.split("step=")[1]))
    last = next(p for p in reversed(checkpoints) if _loads(p))  # the last complete checkpoint
    run_script("preempt", str(corpus), str(resumed), str(REFERENCE_STEPS), "0", str(last))
    return {
        "reference": [read_jsonl(reference / f"rank{r}.jsonl") for r in (0, 1)],
        "killed": [read_jsonl(killed / f"rank{r}.jsonl") for r in (0, 1)],
        "resumed": [read_jsonl(resumed / f"rank{r}.jsonl") for r in (0, 1)],
        "checkpoint": last,
        "checkpoint_step": int(last.stem.split("step=")[1]),
    }


def _entries(tree, key: str):
    """Every value stored under ``key`` anywhere in nested dicts/lists."""
    if isinstance(tree, dict):
        for name, value in tree.items():
            if name == key:
                yield value
            yield from _entries(value, key)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            yield from _entries(value, key)


def _loads(path: Path) -> bool:
    try:
        torch.load(path, weights_only=True)
    except Exception:  # noqa: BLE001 - a checkpoint cut by the kill
        return False
    return True


@pytest.mark.slow
def test_a_ddp_run_killed_mid_way_resumes_from_its_last_checkpoint_exactly_on_every_rank(preemption):
    step = preemption["checkpoint_step"]
    assert 2 <= step < REFERENCE_STEPS - 2
    for rank in (0, 1):
        reference = [b["input_ids"] for b in preemption["reference"][rank]]
        killed = [b["input_ids"] for b in preemption["killed"][rank]]
        resumed = preemption["resumed"][rank]
        assert killed == reference[: len(killed)], f"rank {rank}: the killed run trained on the reference batches"
        assert [b["step"] for b in resumed] == list(range(step, REFERENCE_STEPS))
        assert [b["input_ids"] for b in resumed] == reference[step:], f"rank {rank} resumed on different data"


@pytest.mark.slow
def test_ddp_checkpoint_data_and_metrics_state_load_with_weights_only(preemption):
    checkpoint = torch.load(preemption["checkpoint"], weights_only=True)
    data = checkpoint["TextDataModule"]
    assert data["signature"]["world_size"] == 2 and len(data["ranks"]) == 2
    assert [r["batches_consumed"] for r in data["ranks"]] == [preemption["checkpoint_step"]] * 2
    metrics = checkpoint["callbacks"]["DatasetMetricsCallback{'stream_name': 'all'}"]
    assert metrics["world_size"] == 2 and len(metrics["ranks"]) == 2


@pytest.mark.slow
def test_checkpoint_of_a_streaming_packed_run_with_workers_loads_with_weights_only_and_resumes(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", make_texts(40, seed=4, prefix="S"))

    def fit(max_steps: int, ckpt_path: str | None = None) -> Trainer:
        source = LocalDatasetManager(data_files=str(tmp_path / "a.jsonl"), streaming=True)
        dm = TextDataModule(dataset_managers={"train": {"web": source}}, max_seq_len=64, batch_size=2,
                            num_workers=2, packing="best_fit", cache_dir=str(tmp_path / "cache"))
        trainer = Trainer(accelerator="cpu", max_steps=max_steps, logger=False, enable_progress_bar=False,
                          enable_model_summary=False, limit_val_batches=0,
                          callbacks=[DatasetMetricsCallback(log_every_n_steps=1),
                                     ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3)])
        model = TinyCausalLM(vocab_size=dm.vocab_size, max_seq_len=64, d_model=16, n_layers=1, n_heads=2)
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path, weights_only=True if ckpt_path else None)
        return trainer

    fit(3)
    path = next((tmp_path / "ckpt").glob("*step=3.ckpt"))
    checkpoint = torch.load(path, weights_only=True)  # no pickled code objects anywhere
    assert checkpoint["TextDataModule"]["ranks"][0]["batches_consumed"] == 3
    assert "DatasetMetricsCallback{'stream_name': 'all'}" in checkpoint["callbacks"]
    # Each worker's streaming-source state, shuffle buffer included, is in the data state.
    sources = [e for e in _entries(checkpoint["TextDataModule"]["ranks"], "web") if isinstance(e, dict)]
    assert len(sources) == 2 and all(isinstance(s["buffer_input_ids"], list) for s in sources)
    assert fit(5, str(path)).global_step == 5
