"""The datamodule's batch-transfer hooks under a real Trainer: compact train batches reach the model
as exactly the batches full ones give, for every packing strategy, plain and prompt-masked sources,
from a dataloader worker, and after an exact and an elastic resume; the model's own hook still runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import BatchRecorder, make_texts, write_jsonl
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_tune_data import LocalDatasetManager, TextDataModule
from lightning_tune_data.datamodule.batch_hooks import compact_pays
from lightning_tune_data.keys import COMPACT_LAYOUT, INPUT_IDS, LABELS, TARGET_MASK
from lightning_tune_data.models import TinyCausalLM

STEPS = 4


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    write_jsonl(tmp_path / "web.jsonl", make_texts(40, seed=1, prefix="W", max_words=14))
    rows = [{"prompt": text[: 5 + i % 17], "completion": text[5 + i % 17:]}
            for i, text in enumerate(make_texts(40, seed=2, prefix="Q", max_words=14))]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return tmp_path


class ModelBatches(Callback):
    """Whether a batch still looked compact when the model got it (it never must)."""

    def __init__(self) -> None:
        self.compact: list[bool] = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        self.compact.append(COMPACT_LAYOUT in batch)


def record_loader_batches(dm: TextDataModule) -> list[set]:
    """The keys of every batch the train loader hands out, before the transfer hooks run."""
    keys: list[set] = []
    hook = dm.on_before_batch_transfer

    def recording(batch, dataloader_idx):  # noqa: ANN001
        keys.append(set(batch))
        return hook(batch, dataloader_idx)

    dm.on_before_batch_transfer = recording
    return keys


def datamodule(corpus: Path, masked: bool, **options) -> TextDataModule:
    managers = {"web": LocalDatasetManager(data_files=str(corpus / "web.jsonl"), weight=0.5)}
    if masked:
        managers["sft"] = LocalDatasetManager(
            data_files=str(corpus / "sft.jsonl"), weight=0.5,
            preprocess_function="lightning_tune_data.preprocess.tokenize_prompt_completion")
    settings = dict(max_seq_len=48, batch_size=3, num_workers=1, seed=3, cache_dir=str(corpus / "cache"))
    settings.update(options)
    return TextDataModule({"train": managers}, **settings)


def fit(corpus: Path, run_dir: Path, masked: bool, steps: int = STEPS, ckpt: str | None = None, model_hook=None,
        **options) -> BatchRecorder:
    seed_everything(0)
    recorder, sent = BatchRecorder(), ModelBatches()
    trainer = Trainer(accelerator="cpu", max_steps=steps, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=0, default_root_dir=run_dir,
                      callbacks=[recorder, sent, ModelCheckpoint(dirpath=run_dir / "ckpt", every_n_train_steps=3,
                                                                 save_top_k=-1)])
    dm = datamodule(corpus, masked, **options)
    recorder.loader_keys = record_loader_batches(dm)
    model = TinyCausalLM(vocab_size=dm.vocab_size, max_seq_len=48, d_model=16, n_layers=1, n_heads=2)
    if model_hook is not None:
        model.on_after_batch_transfer = model_hook  # an instance attribute: is_overridden sees it
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
    assert not any(sent.compact)
    return recorder


def assert_same_model_batches(got: BatchRecorder, want: BatchRecorder) -> None:
    assert len(got.batches) == len(want.batches) > 0
    for step, (a, b) in enumerate(zip(got.batches, want.batches)):
        assert list(a) == list(b), f"step {step}: keys {list(a)} != {list(b)}"
        for key in a:
            assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), f"step {step}: {key!r} differs"
    assert got.provenance == want.provenance


@pytest.mark.slow
@pytest.mark.parametrize(("packing", "masked"), [(None, False), (None, True), ("greedy", True), ("best_fit", False),
                                                 ("best_fit", True), ("concat", True)])
def test_the_model_trains_on_the_same_batches_whether_they_travel_compact_or_full(corpus, tmp_path, packing, masked):
    compact = fit(corpus, tmp_path / "compact", masked, packing=packing)
    full = fit(corpus, tmp_path / "full", masked, packing=packing, compact_batches=False)
    assert all(COMPACT_LAYOUT in keys and LABELS not in keys for keys in compact.loader_keys)
    assert any(TARGET_MASK in keys for keys in compact.loader_keys) == masked  # the mask travels only when needed
    assert not any(COMPACT_LAYOUT in keys for keys in full.loader_keys)
    assert_same_model_batches(compact, full)


@pytest.mark.slow
def test_compact_batches_from_workers_resume_exactly_and_elastically_like_full_ones(corpus, tmp_path):
    options = dict(packing="best_fit", num_workers=2)
    compact = fit(corpus, tmp_path / "compact", True, steps=9, **options)
    full = fit(corpus, tmp_path / "full", True, steps=9, compact_batches=False, **options)
    assert_same_model_batches(compact, full)
    assert all(COMPACT_LAYOUT in keys for keys in compact.loader_keys)
    ckpt = str(next((tmp_path / "compact" / "ckpt").glob("*step=3.ckpt")))
    resumed_full = fit(corpus, tmp_path / "resumed-full", True, steps=9, ckpt=ckpt, compact_batches=False, **options)
    assert_same_model_batches(resumed_full, _tail(compact, 3))  # the compact run's checkpoint, resumed exactly
    # another number of workers: the elastic path; compact and full resumed runs see the same batches
    elastic = dict(packing="best_fit", num_workers=3)
    elastic_compact = fit(corpus, tmp_path / "elastic-compact", True, steps=9, ckpt=ckpt, **elastic)
    elastic_full = fit(corpus, tmp_path / "elastic-full", True, steps=9, ckpt=ckpt, compact_batches=False, **elastic)
    assert_same_model_batches(elastic_compact, elastic_full)


def _tail(recorder: BatchRecorder, start: int) -> BatchRecorder:
    tail = BatchRecorder()
    tail.batches, tail.provenance, tail.steps = recorder.batches[start:], recorder.provenance[start:], recorder.steps[start:]
    return tail


@pytest.mark.slow
def test_the_models_own_after_transfer_hook_still_runs_on_the_expanded_batch(corpus, tmp_path):
    seen = []

    def hook(batch, dataloader_idx):  # noqa: ANN001
        seen.append((LABELS in batch, COMPACT_LAYOUT in batch))
        return batch

    with pytest.warns(UserWarning, match="overridden `on_after_batch_transfer` in both"):  # Lightning's notice
        fit(corpus, tmp_path / "hooked", False, steps=2, model_hook=hook, packing="concat")
    assert seen and all(has_labels and not compact for has_labels, compact in seen)


@pytest.mark.slow
def test_without_a_trainer_the_loader_hands_out_full_batches(corpus):
    dm = datamodule(corpus, True, packing="best_fit")
    dm.prepare_data()
    dm.setup("fit")
    loader = dm.train_dataloader()
    batch = next(iter(loader))
    loader._iterator = None
    assert COMPACT_LAYOUT not in batch and batch[INPUT_IDS].dtype == torch.int64 and LABELS in batch


def test_compact_batches_are_used_where_they_pay_and_nowhere_else(corpus, tmp_path):
    cpu_trainer = Trainer(accelerator="cpu", logger=False, default_root_dir=tmp_path)
    assert compact_pays(cpu_trainer, num_workers=2) and not compact_pays(cpu_trainer, num_workers=0)
    assert not compact_pays(None, num_workers=2)  # no Trainer: nothing would expand them
    without_workers = fit(corpus, tmp_path / "in-process", False, steps=2, packing="concat", num_workers=0)
    assert not any(COMPACT_LAYOUT in keys for keys in without_workers.loader_keys)  # a CPU run without workers
