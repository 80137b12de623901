"""Online mixing across a resume and under DDP: bitwise the same batches and weights as the
uninterrupted run, resuming between two updates and right at one; the same weights on every rank."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from online_models import LevelModel, online_datamodule, write_sources

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "online_mixing_ddp_fit.py"


class Batches(Callback):
    """The input ids of every batch the model trains on, by global step."""

    def __init__(self) -> None:
        self.by_step: dict[int, torch.Tensor] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        self.by_step[trainer.global_step] = batch["input_ids"].clone()


def fit(root: Path, run: Path, max_steps: int, ckpt_path: str | None = None, save: bool = False, **options):
    seed_everything(0)
    batches = Batches()
    callbacks: list = [batches]
    if save:
        callbacks.append(ModelCheckpoint(dirpath=run / "ckpt", every_n_train_steps=1, save_top_k=-1))
    trainer = Trainer(accelerator="cpu", max_steps=max_steps, callbacks=callbacks, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                      enable_checkpointing=save, default_root_dir=run)
    datamodule = online_datamodule(root, **options)
    trainer.fit(LevelModel(), datamodule=datamodule, ckpt_path=ckpt_path)
    return batches.by_step, datamodule.mix_control.history


def test_resume_between_updates_and_at_an_update_is_bitwise_the_uninterrupted_run(tmp_path: Path) -> None:
    root = write_sources(tmp_path / "data")
    steps = 24  # updates every 3 steps; weights apply from update + 9 (2 workers, prefetch 2)
    full, history = fit(root, tmp_path / "full", steps, save=True, mix_update_every=3)
    assert len(history) == 7 and len({tuple(w) for _, w in history}) > 3
    for resume_at in (7, 9):  # between two updates, and right at one (its update runs after the resume)
        ckpt = next((tmp_path / "full" / "ckpt").glob(f"*step={resume_at}.ckpt"))
        resumed, resumed_history = fit(root, tmp_path / f"resumed{resume_at}", steps, str(ckpt), mix_update_every=3)
        assert sorted(resumed) == list(range(resume_at, steps))
        for step, ids in resumed.items():
            assert torch.equal(ids, full[step]), f"resumed at {resume_at}: batch of step {step} differs"
        assert resumed_history == history  # every weight, bitwise


def test_packed_resume_is_bitwise_the_uninterrupted_run_with_the_weights_applied(tmp_path: Path) -> None:
    root = write_sources(tmp_path / "data")
    options = dict(packing="best_fit", max_seq_len=256, batch_size=16, packing_buffer_size=4, mix_update_every=2)
    steps = 26
    full, history = fit(root, tmp_path / "full", steps, save=True, **options)
    for resume_at in (11, 12):
        ckpt = next((tmp_path / "full" / "ckpt").glob(f"*step={resume_at}.ckpt"))
        resumed, resumed_history = fit(root, tmp_path / f"resumed{resume_at}", steps, str(ckpt), **options)
        for step, ids in resumed.items():
            assert torch.equal(ids, full[step]), f"resumed at {resume_at}: batch of step {step} differs"
        assert resumed_history == history


def test_packed_weights_apply_after_the_packers_read_ahead(tmp_path: Path) -> None:
    from lightning_tune_data.mixing.online_mixing import MixController

    class AllHigh(MixController):
        def update(self, step, stats):  # noqa: ANN001, ANN201
            return {"low": 0.0, "high": 1.0}

    root = write_sources(tmp_path / "data")
    seed_everything(0)
    datamodule = online_datamodule(root, mix_controller=AllHigh(), packing="best_fit", max_seq_len=256,
                                   batch_size=16, packing_buffer_size=4, mix_update_every=2)
    batches = Batches()
    trainer = Trainer(accelerator="cpu", max_steps=30, callbacks=[batches], logger=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=0, enable_checkpointing=False)
    trainer.fit(LevelModel(), datamodule=datamodule)
    delay = datamodule.mix_control.delay
    assert 9 < delay < 26
    digits = [int(((ids >= 48) & (ids <= 57)).sum()) for _, ids in sorted(batches.by_step.items())]
    assert digits[0] > 0 and digits[-1] == 0  # low's documents stop once the weights apply, read-ahead included


def test_resume_with_another_update_interval_is_refused(tmp_path: Path) -> None:
    root = write_sources(tmp_path / "data")
    fit(root, tmp_path / "full", 4, save=True, mix_update_every=2)
    ckpt = next((tmp_path / "full" / "ckpt").glob("*step=3.ckpt"))
    with pytest.raises(ValueError, match="mix_update_every is 3; set mix_update_every: 2 to resume"):
        fit(root, tmp_path / "other", 6, str(ckpt), mix_update_every=3)


@pytest.mark.slow
def test_two_ranks_two_workers_draw_with_the_same_weights(tmp_path: Path) -> None:
    root = write_sources(tmp_path / "data")
    subprocess.run([sys.executable, str(SCRIPT), str(root), str(tmp_path / "run"), "16"], check=True, timeout=300)
    ranks = [json.loads((tmp_path / "run" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["history"] == ranks[1]["history"] and len(ranks[0]["history"]) == 7
    assert ranks[0]["mixture_weights"] == ranks[1]["mixture_weights"]  # per batch index, the weights drawn by
    assert len({json.dumps(w) for w in ranks[0]["mixture_weights"]}) > 1  # and they did change
    assert ranks[0]["sources"] != ranks[1]["sources"]  # the ranks read different documents


def test_elastic_resume_keeps_the_controller_and_its_history(tmp_path: Path) -> None:
    root = write_sources(tmp_path / "data")
    _, history = fit(root, tmp_path / "full", 12, save=True, mix_update_every=3)
    ckpt = next((tmp_path / "full" / "ckpt").glob("*step=7.ckpt"))
    state = torch.load(ckpt, weights_only=False)
    saved = next(v for k, v in state.items() if k.endswith("TextDataModule"))["mix_control"]
    assert saved["controller"]["t"] == 2 and [s for s, _ in saved["history"]] == [3, 6]
    _, resumed = fit(root, tmp_path / "elastic", 12, str(ckpt), mix_update_every=3, num_workers=1)
    assert resumed[:2] == history[:2]  # the updates before the checkpoint, kept
    assert [s for s, _ in resumed] == [3, 6, 9]  # the controller went on from its third update
