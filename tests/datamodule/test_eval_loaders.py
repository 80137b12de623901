"""Eval loaders: one plain, never-shuffled loader per manager in config order; each rank reads its own
block of every eval dataset, and the unconditional prompts are split by their manager."""

from __future__ import annotations

from functools import partial

from datamodule_config import managers, ready
from torch.utils.data import DataLoader

import lightning_tune_data.datamodule.eval_loaders as eval_loaders_module
from lightning_tune_data import (
    ByteTokenizer,
    LocalDatasetManager,
    TextDataModule,
    UnconditionalGenerationDatasetManager,
)
from lightning_tune_data.datamodule.eval_loaders import eval_loaders
from lightning_tune_data.datamodule.manager_data import loaded_dataset
from lightning_tune_data.loading.loaders import LoaderOptions


def test_eval_loaders_are_plain_unshuffled_dataloaders_covering_every_row_once(corpus_dir, tmp_path):
    datamodule = ready(
        TextDataModule(dataset_managers=managers(corpus_dir), cache_dir=str(tmp_path), eval_batch_size=5, num_workers=2)
    )
    (loader,) = datamodule.val_dataloader()
    assert type(loader) is DataLoader
    rows = [tuple(r[m.bool()].tolist()) for b in loader for r, m in zip(b["input_ids"], b["attention_mask"])]
    assert len(rows) == 13 and len(set(rows)) == 13
    again = [tuple(r[m.bool()].tolist()) for b in datamodule.val_dataloader()[0] for r, m in zip(b["input_ids"], b["attention_mask"])]
    assert sorted(rows) == sorted(again)


def test_predict_with_unconditional_prompts_yields_bos_only_rows(corpus_dir, tmp_path):
    config = managers(corpus_dir)
    config["predict"] = {"unconditional": UnconditionalGenerationDatasetManager(num_examples=6)}
    datamodule = ready(TextDataModule(dataset_managers=config, cache_dir=str(tmp_path), eval_batch_size=4), "predict")
    (loader,) = datamodule.predict_dataloader()
    batches = list(loader)
    assert sum(b["input_ids"].shape[0] for b in batches) == 6
    assert all((b["input_ids"][:, 0] == ByteTokenizer.bos_id).all() for b in batches)
    assert datamodule.dataloader_names["predict"] == ["unconditional"]


def real_rows(loader: DataLoader) -> list[list[int]]:
    return [row[mask.bool()].tolist() for batch in loader for row, mask in zip(batch["input_ids"], batch["attention_mask"])]


def test_each_rank_reads_its_block_of_every_manager_in_config_order(corpus_dir, tmp_path, monkeypatch):
    config = managers(corpus_dir, lm=LocalDatasetManager(data_files=str(corpus_dir / "val.jsonl")),
                      other=LocalDatasetManager(data_files=str(corpus_dir / "b.jsonl")),
                      prompts=UnconditionalGenerationDatasetManager(num_examples=5))
    datamodule = ready(TextDataModule(dataset_managers=config, cache_dir=str(tmp_path)), "validate")
    build = partial(eval_loaders, config["val"], partial(loaded_dataset, datamodule._datasets, "val"),
                    tokenizer=datamodule.tokenizer, cache_dir=tmp_path, max_seq_len=12, pad_to_multiple_of=8,
                    options=LoaderOptions(batch_size=4))
    ranks = []
    for rank in (0, 1):
        monkeypatch.setattr(eval_loaders_module, "current_rank_and_world_size", lambda rank=rank: (rank, 2))
        loaders = build()
        assert [loader.dataset.dataset_name for loader in loaders] == ["lm", "other", "prompts"]
        assert all(batch["input_ids"].shape[1] in (8, 16) for loader in loaders for batch in loader)
        ranks.append([real_rows(loader) for loader in loaders])
    for name, first, second, total in zip(("lm", "other", "prompts"), *ranks, (13, 47, 5)):
        assert len(first) + len(second) == total, name
        assert max(len(row) for row in first + second) <= 12, name  # cut to max_seq_len
    assert [row[0] for rows in ranks for row in rows[2]] == [ByteTokenizer.bos_id] * 5
    assert all(source == "prompts" for batch in build()[2] for source in batch["provenance"]["source"])
