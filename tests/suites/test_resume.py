"""Exact resume through the real Lightning path: checkpoint after step k, resume to step n.

The batches the model trains on after the resume must be bitwise identical to the batches
an uninterrupted run trains on at the same steps (DESIGN decision 5), with shuffling,
interleaving, every packing strategy, dataloader workers, and across a source's pass boundary.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import BatchRecorder
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_tune_data import LocalDatasetManager, TextDataModule
from lightning_tune_data.models import TinyCausalLM

CHECKPOINT_STEP = 5
FINAL_STEP = 12


def make_datamodule(corpus_dir: Path, cache_dir: Path, **overrides) -> TextDataModule:
    options = dict(max_seq_len=64, batch_size=4, num_workers=0, seed=7, packing=None)
    options.update(overrides)
    return TextDataModule(
        dataset_managers={
            "train": {
                "a": LocalDatasetManager(data_files=str(corpus_dir / "a.jsonl"), weight=0.7),
                "b": LocalDatasetManager(data_files=str(corpus_dir / "b.jsonl"), weight=0.3),
            },
        },
        cache_dir=str(cache_dir),
        **options,
    )


def fit(corpus_dir: Path, run_dir: Path, max_steps: int, ckpt_path: str | None = None, **dm_overrides):
    """Run a real fit; return the recorded batches and the checkpoint directory."""
    seed_everything(0)
    recorder = BatchRecorder()
    checkpoints = ModelCheckpoint(dirpath=run_dir / "ckpt", every_n_train_steps=CHECKPOINT_STEP, save_top_k=-1)
    trainer = Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        callbacks=[recorder, checkpoints],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        default_root_dir=run_dir,
    )
    datamodule = make_datamodule(corpus_dir, corpus_dir / "cache", **dm_overrides)
    model = TinyCausalLM(vocab_size=datamodule.vocab_size, max_seq_len=64, d_model=16, n_layers=1, n_heads=2)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return recorder, run_dir / "ckpt"


def assert_same_batches(expected: list[dict], actual: list[dict]) -> None:
    assert len(expected) == len(actual)
    for step, (want, got) in enumerate(zip(expected, actual)):
        assert want.keys() == got.keys(), f"batch {step}: keys differ"
        for key in want:
            assert torch.equal(want[key], got[key]), f"batch {step}: '{key}' differs"


def checkpoint_at(ckpt_dir: Path, step: int) -> str:
    matches = sorted(ckpt_dir.glob(f"*step={step}.ckpt"))
    assert matches, f"no checkpoint for step {step} in {sorted(p.name for p in ckpt_dir.iterdir())}"
    return str(matches[0])


#: Every packing strategy with two workers (each worker holds its own packer and source positions), and
#: every worker count (none, one, several) without packing and with best_fit (the most packer state).
RESUME_CASES = [(None, 0), (None, 1), (None, 2), ("greedy", 2), ("best_fit", 0), ("best_fit", 1), ("best_fit", 2),
                ("concat", 2)]


@pytest.mark.parametrize(("packing", "num_workers"), RESUME_CASES)
def test_resume_after_step_k_matches_uninterrupted_run(corpus_dir: Path, tmp_path: Path, num_workers: int, packing):
    full, ckpt_dir = fit(corpus_dir, tmp_path / "full", FINAL_STEP, num_workers=num_workers, packing=packing)
    assert full.steps == list(range(FINAL_STEP))
    resumed, _ = fit(
        corpus_dir,
        tmp_path / "resumed",
        FINAL_STEP,
        ckpt_path=checkpoint_at(ckpt_dir, CHECKPOINT_STEP),
        num_workers=num_workers,
        packing=packing,
    )
    assert resumed.steps == list(range(CHECKPOINT_STEP, FINAL_STEP))
    assert_same_batches(full.batches[CHECKPOINT_STEP:], resumed.batches)


def test_resume_across_a_pass_boundary_matches_uninterrupted_run(tmp_path: Path):
    # 10 docs per source and batch 4: both sources wrap around several times by step 12.
    from conftest import make_texts, write_jsonl

    write_jsonl(tmp_path / "a.jsonl", make_texts(10, seed=5, prefix="A"))
    write_jsonl(tmp_path / "b.jsonl", make_texts(10, seed=6, prefix="B"))
    full, ckpt_dir = fit(tmp_path, tmp_path / "full", FINAL_STEP, num_workers=2)
    epochs_after_checkpoint = {e for p in full.provenance[CHECKPOINT_STEP:] for e in p["epoch"]}
    assert max(epochs_after_checkpoint) >= 1, "the run must cross a pass boundary after the checkpoint"
    resumed, _ = fit(tmp_path, tmp_path / "resumed", FINAL_STEP, ckpt_path=checkpoint_at(ckpt_dir, CHECKPOINT_STEP),
                     num_workers=2)
    assert_same_batches(full.batches[CHECKPOINT_STEP:], resumed.batches)


def test_same_seed_gives_same_batches_and_another_seed_another_order(corpus_dir: Path, tmp_path: Path):
    first, _ = fit(corpus_dir, tmp_path / "one", 6, num_workers=2)
    second, _ = fit(corpus_dir, tmp_path / "two", 6, num_workers=2)
    assert_same_batches(first.batches, second.batches)
    other, _ = fit(corpus_dir, tmp_path / "three", 6, num_workers=2, seed=8)
    assert any(not torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(first.batches, other.batches))


@pytest.mark.parametrize(
    ("change", "message"),
    [({"packing": "greedy"}, "packing"), ({"seed": 99}, "seed"), ({"max_seq_len": 32}, "max_seq_len")],
)
def test_resume_with_incompatible_data_config_fails_naming_the_change(corpus_dir, tmp_path, change, message):
    _, ckpt_dir = fit(corpus_dir, tmp_path / "full", CHECKPOINT_STEP)
    with pytest.raises(ValueError, match=message):
        fit(corpus_dir, tmp_path / "resumed", FINAL_STEP, ckpt_path=checkpoint_at(ckpt_dir, CHECKPOINT_STEP), **change)


def test_resume_with_changed_weights_warns_and_continues(corpus_dir, tmp_path):
    _, ckpt_dir = fit(corpus_dir, tmp_path / "full", CHECKPOINT_STEP)
    from lightning_tune_data.managers import LocalDatasetManager as Manager

    datamodule = make_datamodule(corpus_dir, corpus_dir / "cache")
    datamodule.dataset_managers["train"]["b"] = Manager(data_files=str(corpus_dir / "b.jsonl"), weight=0.5)
    trainer = Trainer(accelerator="cpu", max_steps=CHECKPOINT_STEP + 2, logger=False, enable_progress_bar=False,
                      enable_checkpointing=False, limit_val_batches=0)
    model = TinyCausalLM(vocab_size=datamodule.vocab_size, max_seq_len=64, d_model=16, n_layers=1, n_heads=2)
    with pytest.warns(UserWarning, match="weights changed"):
        trainer.fit(model, datamodule=datamodule, ckpt_path=checkpoint_at(ckpt_dir, CHECKPOINT_STEP))
    assert trainer.global_step == CHECKPOINT_STEP + 2


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_with_token_weighted_mixing_matches_uninterrupted_run(corpus_dir: Path, tmp_path: Path, num_workers):
    options = dict(num_workers=num_workers, packing="best_fit", mix_by="tokens")
    full, ckpt_dir = fit(corpus_dir, tmp_path / "full", FINAL_STEP, **options)
    resumed, _ = fit(corpus_dir, tmp_path / "resumed", FINAL_STEP, ckpt_path=checkpoint_at(ckpt_dir, CHECKPOINT_STEP),
                     **options)
    assert_same_batches(full.batches[CHECKPOINT_STEP:], resumed.batches)


def test_state_dict_in_a_loop_without_a_trainer_resumes_after_the_last_batch_handed_out(corpus_dir: Path):
    def datamodule():
        dm = make_datamodule(corpus_dir, corpus_dir / "cache", packing="best_fit")
        dm.prepare_data()
        dm.setup("fit")
        return dm

    reference = iter(datamodule().train_dataloader())
    expected = [next(reference) for _ in range(7)]
    first = datamodule()
    loop = iter(first.train_dataloader())
    for _ in range(4):
        next(loop)
    state = first.state_dict()  # no Trainer: every batch handed out counts as consumed
    second = datamodule()
    second.load_state_dict(state)
    resumed = iter(second.train_dataloader())
    for want in expected[4:]:
        got = next(resumed)
        assert torch.equal(want["input_ids"], got["input_ids"])
