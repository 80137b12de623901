"""Resume with another world size, number of workers or batch size, through a real Trainer.

The guarantee: within the pass in progress every document is used exactly once across the old
and the resumed run (nothing lost from open packs or the loader's prefetch, nothing repeated),
the mix stays on its weights, and the new layout's order is deterministic.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import make_texts, write_jsonl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from elastic_fit import CHECKPOINT_EVERY, fit  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "elastic_fit.py"
SIZES = {"a": 60, "b": 48}  # divisible by every shard count used here: no per-pass remainder


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    for name, count in SIZES.items():
        write_jsonl(tmp_path / f"{name}.jsonl", make_texts(count, seed=ord(name), prefix=name.upper(), max_words=12))
    return tmp_path


def run(corpus: Path, run_dir: Path, max_steps: int, devices: int, workers: int, batch: int, packing: str | None,
        ckpt: str | None = None) -> list[dict]:
    """One fit; the recorded documents of every rank."""
    if devices == 1:
        return [fit(corpus, run_dir, max_steps, 1, workers, batch, packing, ckpt)]
    args = [sys.executable, str(SCRIPT), str(corpus), str(run_dir), str(max_steps), str(devices), str(workers),
            str(batch), packing or "none"]
    if ckpt:
        args.append(ckpt)
    result = subprocess.run(args, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads((run_dir / f"rank{rank}.json").read_text()) for rank in range(devices)]


def checkpoint(run_dir: Path, step: int) -> str:
    return str(next((run_dir / "ckpt").glob(f"*step={step}.ckpt")))


def chain(corpus: Path, tmp_path: Path, segments: list[tuple[int, int, int, int]], packing: str | None) -> list[list]:
    """Run segments ``(until_step, devices, workers, batch)``, each resuming the previous one's last checkpoint."""
    documents, ckpt = [], None
    for index, (until, devices, workers, batch) in enumerate(segments):
        run_dir = tmp_path / f"segment{index}"
        results = run(corpus, run_dir, until, devices, workers, batch, packing, ckpt)
        for rank_result in results:
            assert rank_result["global_step"] == until
            documents += [doc for batch_docs in rank_result["documents"] for doc in batch_docs]
        ckpt = checkpoint(run_dir, until)
    # the dataset metrics carried over every layout change: they count every document the model saw
    for source in SIZES:
        assert results[0]["samples_seen"][source] == sum(1 for s, _, _ in documents if s == source)
    return documents


def assert_first_pass_used_exactly_once(documents: list[list]) -> None:
    for source, size in SIZES.items():
        names = [name for s, epoch, name in documents if s == source and epoch == 0]
        repeated = [n for n, c in collections.Counter(names).items() if c > 1]
        assert not repeated, f"source {source}: documents used twice in pass 0: {repeated}"
        missing = {f"{source.upper()}{i}" for i in range(size)} - set(names)
        assert not missing, f"source {source}: documents of pass 0 never used: {sorted(missing)}"


@pytest.mark.slow
@pytest.mark.parametrize("packing", [None, "best_fit"])
def test_num_workers_2_then_1_then_3_uses_every_document_of_the_pass_exactly_once(corpus, tmp_path, packing):
    segments = [(CHECKPOINT_EVERY, 1, 2, 4), (2 * CHECKPOINT_EVERY, 1, 1, 4), (45, 1, 3, 4)]
    documents = chain(corpus, tmp_path, segments, packing)
    assert_first_pass_used_exactly_once(documents)
    shares = collections.Counter(source for source, _, _ in documents)
    assert abs(shares["a"] / sum(shares.values()) - 0.6) < 0.05  # the mix stays on its weights


@pytest.mark.slow
def test_after_an_elastic_resume_the_new_layout_is_deterministic(corpus, tmp_path):
    run(corpus, tmp_path / "old", CHECKPOINT_EVERY, 1, 2, 4, "best_fit")
    ckpt = checkpoint(tmp_path / "old", CHECKPOINT_EVERY)
    first = run(corpus, tmp_path / "one", 30, 1, 1, 4, "best_fit", ckpt)[0]
    second = run(corpus, tmp_path / "two", 30, 1, 1, 4, "best_fit", ckpt)[0]
    assert first["batches"] == second["batches"]


@pytest.mark.slow
@pytest.mark.parametrize("packing", [None, "best_fit"])
def test_batch_size_8_then_16_uses_every_document_of_the_pass_exactly_once(corpus, tmp_path, packing):
    documents = chain(corpus, tmp_path, [(CHECKPOINT_EVERY, 1, 2, 8), (30, 1, 2, 16)], packing)
    assert_first_pass_used_exactly_once(documents)


@pytest.mark.slow
def test_two_ddp_ranks_then_one_uses_every_document_of_the_pass_exactly_once(corpus, tmp_path):
    # One DDP run per layout change: best_fit carries packs as well as the sources' positions across the
    # change; the unpacked path's merge is the one the num_workers and batch_size changes above run too.
    packing = "best_fit"
    documents = chain(corpus, tmp_path, [(CHECKPOINT_EVERY, 2, 0, 4), (45, 1, 0, 4)], packing)
    assert_first_pass_used_exactly_once(documents)


@pytest.mark.slow
def test_one_rank_then_two_ddp_ranks_uses_every_document_of_the_pass_exactly_once(corpus, tmp_path):
    # One DDP run per layout change: best_fit carries packs as well as the sources' positions across the
    # change; the unpacked path's merge is the one the num_workers and batch_size changes above run too.
    packing = "best_fit"
    documents = chain(corpus, tmp_path, [(CHECKPOINT_EVERY, 1, 2, 4), (30, 2, 1, 4)], packing)
    assert_first_pass_used_exactly_once(documents)


def test_unresumable_change_names_the_opt_out_and_the_opt_out_restarts_the_data(corpus, tmp_path):
    run(corpus, tmp_path / "old", CHECKPOINT_EVERY, 1, 0, 4, None)
    ckpt = checkpoint(tmp_path / "old", CHECKPOINT_EVERY)
    from lightning_tune_data import LocalDatasetManager, TextDataModule

    def datamodule(**overrides):
        managers = {name: LocalDatasetManager(data_files=str(corpus / f"{name}.jsonl"), weight=w)
                    for name, w in (("a", 0.6), ("b", 0.4))}
        options = dict(max_seq_len=64, batch_size=4, seed=7, cache_dir=str(corpus / "cache"))
        options.update(overrides)
        return TextDataModule({"train": managers}, **options)

    state = torch.load(ckpt, weights_only=True)["TextDataModule"]
    with pytest.raises(ValueError, match=r"seed: checkpoint 7 -> now 8.*resume_data_state: false"):
        datamodule(seed=8).load_state_dict(state)
    fresh = datamodule(seed=8, resume_data_state=False)
    with pytest.warns(UserWarning, match="starts again from the beginning"):
        fresh.load_state_dict(state)
    assert fresh._resume.pending is None


def test_a_checkpoint_of_the_previous_state_version_is_a_clear_error(corpus, tmp_path):
    run(corpus, tmp_path / "old", CHECKPOINT_EVERY, 1, 0, 4, None)
    state = torch.load(checkpoint(tmp_path / "old", CHECKPOINT_EVERY), weights_only=True)["TextDataModule"]
    state["version"] = 1
    from lightning_tune_data import LocalDatasetManager, TextDataModule

    dm = TextDataModule({"train": {"a": LocalDatasetManager(data_files=str(corpus / "a.jsonl"))}}, cache_dir=str(corpus))
    with pytest.raises(ValueError, match=r"version 1.*cannot be converted.*resume_data_state: false"):
        dm.load_state_dict(state)


def test_saved_data_state_is_plain_json_with_no_token_ids(corpus, tmp_path):
    run(corpus, tmp_path / "old", CHECKPOINT_EVERY, 1, 2, 4, "best_fit")
    state = torch.load(checkpoint(tmp_path / "old", CHECKPOINT_EVERY), weights_only=True)["TextDataModule"]
    text = json.dumps(state)  # raises on tensors or other non-plain values
    worker_states = [w["dataset_state"] for w in state["ranks"][0]["loader"]["loader"]["_snapshot"]["_worker_snapshots"].values()]
    packs = [s["packed_interleaved"]["packs"] for s in worker_states]
    assert all(p["inline"] == {} for p in packs)
    assert len(text) < 64 * 1024
