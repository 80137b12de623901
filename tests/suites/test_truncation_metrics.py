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


def write_sft(path: Path, prompt_lengths: list[int]) -> Path:
    """Prompt/completion rows whose prompts have the given lengths in bytes (one ByteTokenizer token each)."""
    import json

    with path.open("w", encoding="utf-8") as handle:
        for i, n in enumerate(prompt_lengths):
            handle.write(json.dumps({"prompt": ("q" * n)[:n], "completion": f" answer {i}"}) + "\n")
    return path


def target_labels_of_pieces(batch: dict, provenance: dict) -> list[int]:
    """Target labels of every document piece of a recorded batch, read from its tensors (not the provenance)."""
    labels = batch["labels"]
    if "seq_lens" in batch:
        counts = []
        for row in range(labels.shape[0]):
            offset = 0
            for length in (int(n) for n in batch["seq_lens"][row] if n > 0):
                counts.append(int((labels[row, offset : offset + length] != -100).sum()))
                offset += length
        return counts
    return (labels != -100).sum(dim=1).tolist()


@pytest.mark.parametrize("packing", [None, "best_fit"])
def test_sft_documents_left_with_no_target_by_max_seq_len_are_counted_and_shown_at_the_end_of_the_fit(
        tmp_path: Path, packing, capsys):
    from conftest import BatchRecorder

    from lightning_tune_data.sources.lengths import no_target_summary

    # max_seq_len=12: prompts of 11 bytes or more (+ BOS) leave no completion token inside the row
    prompts = [2, 30, 4, 14, 25, 3, 40, 1, 20, 6, 33, 5]
    write_jsonl(tmp_path / "web.jsonl", make_texts(20, seed=4, prefix="W", max_words=2))
    dm = TextDataModule(
        {"train": {
            "web": LocalDatasetManager(data_files=str(tmp_path / "web.jsonl"), weight=0.6),
            "sft": LocalDatasetManager(data_files=str(write_sft(tmp_path / "sft.jsonl", prompts)), weight=0.4,
                                       preprocess_function="lightning_tune_data.preprocess.tokenize_prompt_completion"),
        }},
        max_seq_len=12, batch_size=6, packing=packing, cache_dir=str(tmp_path / "cache"))
    callback, recorder = DatasetMetricsCallback(log_every_n_steps=2), BatchRecorder()
    trainer = Trainer(accelerator="cpu", max_steps=12, callbacks=[recorder, callback], logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      limit_val_batches=0)
    with pytest.warns(UserWarning, match=r"Train source 'sft': 6 of 12 documents \(50.0%\) have no target token"):
        trainer.fit(TinyCausalLM(vocab_size=dm.vocab_size, max_seq_len=12, d_model=16, n_layers=1, n_heads=2),
                    datamodule=dm)
    assert no_target_summary("sft", dm.dataset("train", "sft"), 12).no_target == sum(n >= 11 for n in prompts) == 6

    expected = {"sft": [0, 0], "web": [0, 0]}  # [documents with no target, target labels], from the tensors
    for batch, provenance in zip(recorder.batches, recorder.provenance):
        for source, new, targets in zip(provenance["source"], provenance["new_document"],
                                        target_labels_of_pieces(batch, provenance)):
            expected[source][0] += int(new and targets == 0)
            expected[source][1] += targets
    metrics = callback.get_metrics()
    for source, (no_target, targets) in expected.items():
        assert metrics[source]["metrics"]["no_target_docs"] == no_target
        assert metrics[source]["metrics"]["target_tokens"] == targets
    assert expected["sft"][0] > 0 and expected["web"][0] == 0
    printed = capsys.readouterr().out
    sft_row = next(line for line in printed.splitlines() if line.startswith("sft "))
    assert sft_row.split()[-1] == str(expected["sft"][0])
    assert f"Note: 'sft': {expected['sft'][0]} of {metrics['sft']['metrics']['samples_seen']} documents trained on " \
           "had no target token" in printed
