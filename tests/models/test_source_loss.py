"""Per-source loss: ``split_loss_by_source`` on hand-built batches, and ``train/<source>/loss`` through a Trainer.

The DDP test runs ``scripts/source_loss_ddp_fit.py`` (2 gloo ranks): every logged per-source loss
must equal the sum over both ranks' label tokens of that source divided by their count.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_texts, write_jsonl
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.loggers import CSVLogger

from lightning_tune_data import LocalDatasetManager, TextDataModule, split_loss_by_source
from lightning_tune_data.collate import PackedCollator, PaddedCollator, shifted_labels
from lightning_tune_data.models import TinyCausalLM
from lightning_tune_data.models.source_loss import document_index

DDP_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "source_loss_ddp_fit.py"
PAD = 99


def doc(ids: list[int], source: str, mask: list[bool] | None = None) -> dict:
    sample = {"input_ids": np.asarray(ids, dtype=np.int64), "source": source, "epoch": 0}
    if mask is not None:
        sample["loss_mask"] = np.asarray(mask, dtype=bool)
    return sample


def pack(documents: list[dict]) -> dict:
    ids = [d["input_ids"] for d in documents]
    return {
        "input_ids": np.concatenate(ids),
        "labels": np.concatenate([shifted_labels(i, d.get("loss_mask")) for i, d in zip(ids, documents)]),
        "position_ids": np.concatenate([np.arange(len(i)) for i in ids]),
        "document_ids": np.concatenate([np.full(len(i), k) for k, i in enumerate(ids)]),
        "seq_lens": [len(i) for i in ids],
        "provenance": [{"source": d["source"], "epoch": 0, "tokens": len(i), "new_document": True}
                       for d, i in zip(documents, ids)],
    }


def test_packed_batch_loss_splits_by_each_documents_source_by_hand() -> None:
    # row 0: code[1,2,3] prose[4,5]; row 1: prose[6,7,8,9 with prompt 7 masked] + padding
    batch = PackedCollator(pad_id=PAD)([
        pack([doc([1, 2, 3], "code"), doc([4, 5], "prose")]),
        pack([doc([6, 7, 8, 9], "prose", mask=[False, False, True, True])]),
    ])
    token_loss = torch.arange(10, dtype=torch.float32).repeat(2, 1) / 10 + torch.tensor([[0.0], [1.0]])
    # labels: row 0 = [2, 3, X, 5, X]; row 1 = [X, 8, 9, X, pad]
    # code: positions (0,0),(0,1) -> 0.0 + 0.1; prose: (0,3) -> 0.3, (1,1) -> 1.1, (1,2) -> 1.2
    split = split_loss_by_source(token_loss[:, :5], batch, sources=["prose", "code", "math"])
    assert split.sources == ["prose", "code", "math"]
    assert split.tokens.tolist() == [3.0, 2.0, 0.0]
    assert split.loss_sum.tolist() == pytest.approx([0.3 + 1.1 + 1.2, 0.0 + 0.1, 0.0])
    means = split.means()
    assert set(means) == {"prose", "code"}, "a source without label tokens in the batch has no loss"
    assert float(means["prose"]) == pytest.approx((0.3 + 1.1 + 1.2) / 3)
    assert float(means["code"]) == pytest.approx(0.05)


def test_padded_batch_assigns_each_row_to_its_document() -> None:
    batch = PaddedCollator(pad_id=PAD)([doc([1, 2, 3], "a"), doc([4, 5], "b"), doc([6, 7, 8, 9], "a")])
    assert document_index(batch).tolist() == [[0, 0, 0, -1], [1, 1, -1, -1], [2, 2, 2, 2]]
    token_loss = torch.tensor([[1.0, 2, 9, 9], [4, 9, 9, 9], [5, 6, 7, 9]])
    means = split_loss_by_source(token_loss, batch).means()
    assert float(means["a"]) == pytest.approx((1 + 2 + 5 + 6 + 7) / 5)
    assert float(means["b"]) == pytest.approx(4.0)


def test_split_rejects_a_source_missing_from_the_list_and_a_wrong_shape() -> None:
    batch = PaddedCollator(pad_id=PAD)([doc([1, 2, 3], "a"), doc([4, 5], "b")])
    with pytest.raises(ValueError, match=r"documents of \['b'\], not among sources=\['a'\]"):
        split_loss_by_source(torch.zeros(2, 3), batch, sources=["a"])
    with pytest.raises(ValueError, match="token_loss has shape \\(6,\\)"):
        split_loss_by_source(torch.zeros(6), batch)


def test_sums_add_up_across_batches_to_the_token_weighted_mean() -> None:
    first = PaddedCollator(pad_id=PAD)([doc([1, 2, 3, 4, 5], "a")])  # 4 label tokens, loss 1 each
    second = PaddedCollator(pad_id=PAD)([doc([1, 2], "a")])  # 1 label token, loss 6
    one = split_loss_by_source(torch.ones(1, 5), first, ["a"])
    two = split_loss_by_source(torch.full((1, 2), 6.0), second, ["a"])
    total = (one.loss_sum + two.loss_sum) / (one.tokens + two.tokens)
    assert float(total[0]) == pytest.approx(2.0), "(4*1 + 6) / 5, not the mean of the means 3.5"


# --------------------------------------------------------------------------- through a Trainer
@pytest.fixture
def two_sources(tmp_path: Path) -> Path:
    write_jsonl(tmp_path / "a.jsonl", make_texts(23, seed=5, prefix="A", max_words=12))
    write_jsonl(tmp_path / "b.jsonl", make_texts(19, seed=6, prefix="B", max_words=30))
    return tmp_path


def read_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize("packing", [None, "best_fit"])
def test_tiny_lm_logs_every_sources_loss_next_to_the_overall_loss(two_sources: Path, tmp_path: Path, packing) -> None:
    seed_everything(0)
    datamodule = TextDataModule(
        dataset_managers={"train": {"a": LocalDatasetManager(data_files=str(two_sources / "a.jsonl"), weight=0.5),
                                    "b": LocalDatasetManager(data_files=str(two_sources / "b.jsonl"), weight=0.5)}},
        max_seq_len=64, batch_size=4, seed=1, packing=packing, cache_dir=str(two_sources / "cache"),
    )
    model = TinyCausalLM(vocab_size=datamodule.vocab_size, max_seq_len=64, d_model=16, n_layers=1, n_heads=2)
    logger = CSVLogger(save_dir=tmp_path / "run", name="csv", version=0)
    trainer = Trainer(accelerator="cpu", max_steps=4, logger=logger, log_every_n_steps=1, limit_val_batches=0,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, datamodule=datamodule)
    rows = [r for r in read_rows(Path(logger.log_dir) / "metrics.csv") if r.get("train/interleaved/loss")]
    assert len(rows) == 4
    for row in rows:
        per_source = [float(row[k]) for k in ("train/a/loss", "train/b/loss") if row.get(k)]
        assert per_source, "each step logs the loss of the sources it trained on"
        overall = float(row["train/interleaved/loss"])
        assert min(per_source) - 1e-5 <= overall <= max(per_source) + 1e-5, "the overall loss is their weighted mean"


@pytest.mark.slow
def test_per_source_loss_is_exact_over_two_ddp_ranks(two_sources: Path, tmp_path: Path) -> None:
    run = tmp_path / "ddp"
    result = subprocess.run([sys.executable, str(DDP_SCRIPT), str(two_sources), str(run), "5"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((run / f"rank{r}.json").read_text()) for r in (0, 1)]
    logged = {int(r["step"]): r for r in read_rows(run / "csv" / "version_0" / "metrics.csv")
              if r.get("train/a/loss") or r.get("train/b/loss")}
    assert sorted(logged) == [0, 1, 2, 3, 4]
    mean_of_means_differs = False
    for step in range(5):
        for source in ("a", "b"):
            sums = [sum(loss for loss, s in zip(rank["steps"][step]["loss"], rank["steps"][step]["source"]) if s == source)
                    for rank in ranks]
            counts = [rank["steps"][step]["source"].count(source) for rank in ranks]
            if sum(counts) == 0:
                assert not logged[step].get(f"train/{source}/loss")
                continue
            exact = sum(sums) / sum(counts)
            assert float(logged[step][f"train/{source}/loss"]) == pytest.approx(exact, rel=1e-5)
            if all(counts):
                mean_of_means = (sums[0] / counts[0] + sums[1] / counts[1]) / 2
                mean_of_means_differs |= abs(mean_of_means - exact) > 1e-3
    assert mean_of_means_differs, "the data must tell the exact reduction from a mean of per-rank means"
