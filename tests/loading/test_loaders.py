"""Dataloader selection: which documents, loader and sampler each split gets, with which options."""

from __future__ import annotations

import pickle

import datasets
import numpy as np
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler, StatefulDistributedSampler

from lightning_tune_data import LocalDatasetManager, TextDataModule
from lightning_tune_data.collate import PaddedCollator
from lightning_tune_data.loading.loaders import (
    EvalDocuments,
    LoaderOptions,
    MapStyleDocuments,
    build_eval_loader,
    build_train_loader,
)
from lightning_tune_data.sources.memory import InMemoryStream


def ready(datamodule: TextDataModule, stage: str = "fit") -> TextDataModule:
    datamodule.prepare_data()
    datamodule.setup(stage)
    return datamodule


def managers(corpus_dir) -> dict:
    return {"train": {"a": LocalDatasetManager(data_files=str(corpus_dir / "a.jsonl"))},
            "val": {"lm": LocalDatasetManager(data_files=str(corpus_dir / "val.jsonl"))}}


def test_eval_rows_are_split_across_ranks_without_duplicates(corpus_dir, tmp_path):
    from lightning_tune_data.loading.loaders import EvalDocuments

    datamodule = ready(TextDataModule(dataset_managers=managers(corpus_dir), cache_dir=str(tmp_path)), "validate")
    dataset = datamodule.dataset("val", "lm")
    shards = [list(EvalDocuments(dataset, "lm", rank, 3)) for rank in range(3)]
    sizes = [len(s) for s in shards]
    assert sum(sizes) == 13 and max(sizes) - min(sizes) <= 1
    flat = [tuple(d["input_ids"].tolist()) for shard in shards for d in shard]
    assert len(set(flat)) == 13


def test_map_style_train_uses_a_seeded_stateful_random_sampler(corpus_dir, tmp_path):
    config = {"train": {"a": LocalDatasetManager(data_files=str(corpus_dir / "a.jsonl"))}}
    datamodule = ready(TextDataModule(dataset_managers=config, cache_dir=str(tmp_path), train_mode="map", batch_size=4))
    loader = datamodule.train_dataloader()
    assert isinstance(loader.loader.sampler, RandomSampler)
    first = [b["input_ids"] for b, _ in zip(loader, range(3))]
    again = ready(TextDataModule(dataset_managers=config, cache_dir=str(tmp_path), train_mode="map", batch_size=4))
    second = [b["input_ids"] for b, _ in zip(again.train_dataloader(), range(3))]
    assert all(torch.equal(x, y) for x, y in zip(first, second))


def table(rows: int) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"input_ids": [[i] * (1 + i % 6) for i in range(rows)],
                                       "loss_mask": [[1] * (1 + i % 6) for i in range(rows)]})


def test_loader_options_give_train_and_eval_their_keyword_arguments():
    options = LoaderOptions(batch_size=4, num_workers=2, pin_memory=True, prefetch_factor=3, persistent_workers=True)
    assert options.kwargs(train=True) == {"batch_size": 4, "num_workers": 2, "pin_memory": True, "drop_last": True,
                                          "prefetch_factor": 3, "persistent_workers": False}
    assert options.kwargs(train=False)["drop_last"] is False and options.kwargs(train=False)["persistent_workers"]
    assert LoaderOptions(batch_size=2).kwargs(train=True) == {"batch_size": 2, "num_workers": 0, "pin_memory": False,
                                                              "drop_last": True}


def test_eval_documents_cut_each_document_and_name_its_source():
    documents = list(EvalDocuments(table(10), "lm", rank=1, world_size=2, max_seq_len=3))
    assert [int(d["input_ids"][0]) for d in documents] == [5, 6, 7, 8, 9]
    assert all(len(d["input_ids"]) <= 3 and len(d["loss_mask"]) == len(d["input_ids"]) for d in documents)
    assert all(d["loss_mask"].dtype == bool and d["source"] == "lm" and d["epoch"] == 0 for d in documents)
    given = list(EvalDocuments([{"input_ids": [1, 2, 3], "source": "kept"}], "lm", max_seq_len=2))
    assert given[0]["input_ids"].tolist() == [1, 2] and given[0]["source"] == "kept"


def test_an_eval_loader_has_no_more_workers_than_rows():
    dataset = EvalDocuments(table(3), "lm")
    loader = build_eval_loader(dataset, PaddedCollator(pad_id=0), LoaderOptions(batch_size=2, num_workers=8))
    assert type(loader) is DataLoader and loader.num_workers == 3 and not loader.drop_last
    empty = build_eval_loader(EvalDocuments(table(0), "lm"), PaddedCollator(pad_id=0),
                              LoaderOptions(batch_size=2, num_workers=2))
    assert empty.num_workers == 0 and list(empty) == []


def test_map_style_documents_cut_rows_and_pickle_without_their_row_reader():
    documents = MapStyleDocuments(table(8), "a", max_seq_len=2)
    assert len(documents) == 8
    sample = documents[5]
    assert sample["input_ids"].tolist() == [5, 5] and sample["source"] == "a" and sample["epoch"] == 0
    restored = pickle.loads(pickle.dumps(documents))
    assert restored._rows is None and np.array_equal(restored[5]["input_ids"], sample["input_ids"])


def test_the_train_sampler_follows_the_selection_table():
    collate = PaddedCollator(pad_id=0)
    options = LoaderOptions(batch_size=2)
    stream = build_train_loader(InMemoryStream([[1, 2]] * 4, "s"), collate, options, seed=0)
    assert isinstance(stream.loader, StatefulDataLoader)
    assert not isinstance(stream.loader.sampler, (RandomSampler, StatefulDistributedSampler))
    assert stream.end_sync_group is None
    single = build_train_loader(MapStyleDocuments(table(8), "a"), collate, options, seed=3)
    assert isinstance(single.loader.sampler, RandomSampler)
    distributed = build_train_loader(MapStyleDocuments(table(8), "a"), collate, options, seed=3, rank=1, world_size=2)
    sampler = distributed.loader.sampler
    assert isinstance(sampler, StatefulDistributedSampler) and (sampler.rank, sampler.num_replicas) == (1, 2)
    assert sampler.shuffle and sampler.seed == 3
    first = [batch["input_ids"] for batch in build_train_loader(MapStyleDocuments(table(8), "a"), collate, options, 3)]
    again = [batch["input_ids"] for batch in build_train_loader(MapStyleDocuments(table(8), "a"), collate, options, 3)]
    assert all(torch.equal(x, y) for x, y in zip(first, again, strict=True))
