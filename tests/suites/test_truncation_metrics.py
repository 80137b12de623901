"""Truncation metrics through a real Trainer equal the overlong documents of the data."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import make_texts, write_jsonl
from lightning.pytorch import Trainer

from lightning_tune_data import ByteTokenizer, DatasetMetricsCallback, LocalDatasetManager, TextDataModule
from lightning_tune_data.models import TinyCausalLM

MAX_SEQ_LEN = 48


@pytest.mark.parametrize("overlong", ["truncate", "drop"])
def test_truncation_metrics_after_one_pass_equal_the_overlong_documents_of_the_source(tmp_path: Path, overlong):
    texts = make_texts(40, seed=9, prefix="T", max_words=14)
    write_jsonl(tmp_path / "t.jsonl", texts)
    lengths = [len(ByteTokenizer().encode(t)) + 2 for t in texts]  # BOS + bytes + EOS
    overlong_docs = [n for n in lengths if n > MAX_SEQ_LEN]
    assert 0 < len(overlong_docs) < len(texts)
    kept = len(texts) - (len(overlong_docs) if overlong == "drop" else 0)
    dm = TextDataModule({"train": {"t": LocalDatasetManager(data_files=str(tmp_path / "t.jsonl"), shuffle=False)}},
                        max_seq_len=MAX_SEQ_LEN, batch_size=kept, overlong=overlong, cache_dir=str(tmp_path / "cache"))
    callback = DatasetMetricsCallback(log_every_n_steps=1, print_summary=False)
    trainer = Trainer(accelerator="cpu", max_steps=1, callbacks=[callback], logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(TinyCausalLM(vocab_size=dm.vocab_size, max_seq_len=MAX_SEQ_LEN, d_model=16, n_layers=1, n_heads=2),
                datamodule=dm)
    metrics = callback.get_metrics()["t"]["metrics"]  # one batch = exactly the first pass
    if overlong == "truncate":
        assert metrics["truncated_docs"] == len(overlong_docs)
        assert metrics["truncated_tokens"] == sum(n - MAX_SEQ_LEN for n in overlong_docs)
        assert metrics["dropped_docs"] == 0
    else:
        # a drop is reported with the next kept document: those after the file's last kept one come with pass 1
        last_kept = max(i for i, n in enumerate(lengths) if n <= MAX_SEQ_LEN)
        assert metrics["dropped_docs"] == sum(1 for n in lengths[:last_kept] if n > MAX_SEQ_LEN)
        assert metrics["truncated_docs"] == 0
