"""One rank's train stream: one settings object per rank, shared by every source, the mixer and the packer."""

from __future__ import annotations

import itertools
import warnings
from dataclasses import asdict, replace

import datasets
import pytest
import torch
from datamodule_config import managers, ready

from lightning_tune_data import LocalDatasetManager, TextDataModule
from lightning_tune_data.collate import PackedCollator
from lightning_tune_data.datamodule.train_stream import (
    TrainStreamConfig,
    normalised_weights,
    packing_splits_documents,
    warn_overlong_documents,
)
from lightning_tune_data.mixing.interleave import InterleavedDataset
from lightning_tune_data.packing.packer import PACKING_STRATEGIES, IterablePackedDataset
from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.arrow import ArrowSource

CONFIG = TrainStreamConfig(seed=7, max_seq_len=16, overlong="drop", stopping_strategy="first_exhausted",
                           mix_by="tokens", stream_name="mix", packing=None, packing_buffer_size=8, num_workers=0)


def documents(count: int, first: int) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"input_ids": [[first + i] * (2 + i % 5) for i in range(count)]})


def train_managers(corpus_dir) -> dict[str, LocalDatasetManager]:
    return {name: LocalDatasetManager(data_files=str(corpus_dir / f"{name}.jsonl"), weight=weight)
            for name, weight in (("a", 3.0), ("b", 1.0))}


DATA = {"a": documents(20, 100), "b": documents(12, 500)}


def test_only_the_concat_strategy_splits_documents_itself():
    assert [name for name in PACKING_STRATEGIES if packing_splits_documents(name)] == ["concat"]
    assert not packing_splits_documents(None)


def test_a_ranks_settings_come_from_the_config():
    assert CONFIG.settings(1, 2) == StreamSettings(seed=7, rank=1, world_size=2, num_passes=1, max_seq_len=16,
                                                   overlong="drop")
    assert replace(CONFIG, stopping_strategy="infinite").settings().num_passes is None
    assert replace(CONFIG, packing="concat").settings().max_seq_len is None  # the packer splits long documents
    assert replace(CONFIG, packing="best_fit").settings().max_seq_len == 16


def test_the_sources_the_mixer_and_the_packer_share_one_settings_object(corpus_dir):
    packed = replace(CONFIG, packing="best_fit").build(train_managers(corpus_dir), DATA.__getitem__, rank=1, world_size=2)
    mixer = packed.dataset
    assert isinstance(packed, IterablePackedDataset) and isinstance(mixer, InterleavedDataset)
    shared = mixer.settings
    assert shared == CONFIG.settings(1, 2)
    assert all(source.settings is shared for source in mixer.datasets)
    assert packed.state_dict()[packed.dataset_name]["max_seq_len"] == shared.max_seq_len == 16


def test_every_source_and_the_mixer_take_the_one_settings_objects_values(corpus_dir):
    stream = CONFIG.build(train_managers(corpus_dir), DATA.__getitem__, rank=1, world_size=2)
    settings = CONFIG.settings(1, 2)
    assert isinstance(stream, InterleavedDataset) and stream.dataset_name == "mix"
    assert (stream.rank, stream.world_size, stream.mix_by, stream.stopping_strategy) == (1, 2, "tokens", "first_exhausted")
    assert stream.weights == {"a": 0.75, "b": 0.25}
    for source, name in zip(stream.datasets, ("a", "b"), strict=True):
        assert isinstance(source, ArrowSource) and source.dataset_name == name
        fields = {field: getattr(source, field) for field in asdict(settings)}
        assert fields == asdict(settings)


def test_one_infinite_source_is_the_stream_and_a_finite_one_is_still_mixed(corpus_dir):
    only = {"a": train_managers(corpus_dir)["a"]}
    infinite = replace(CONFIG, stopping_strategy="infinite").build(only, DATA.__getitem__)
    assert isinstance(infinite, ArrowSource) and infinite.num_passes is None
    finite = CONFIG.build(only, DATA.__getitem__)
    assert isinstance(finite, InterleavedDataset) and [s.dataset_name for s in finite.datasets] == ["a"]


@pytest.mark.parametrize("packing", PACKING_STRATEGIES)
def test_packing_wraps_the_mixture_in_rows_of_max_seq_len(corpus_dir, packing):
    stream = replace(CONFIG, packing=packing).build(train_managers(corpus_dir), DATA.__getitem__)
    assert isinstance(stream, IterablePackedDataset) and isinstance(stream.dataset, InterleavedDataset)
    assert (stream.strategy, stream.max_seq_len) == (packing, 16)
    expected_limit = None if packing == "concat" else 16
    assert [source.max_seq_len for source in stream.dataset.datasets] == [expected_limit, expected_limit]
    batch = PackedCollator(pad_id=0, max_seq_len=16)(list(itertools.islice(iter(stream), 5)))
    assert batch["input_ids"].shape == (5, 16)


def test_a_source_with_fewer_rows_than_shards_fails_before_any_worker_starts(corpus_dir):
    config = replace(CONFIG, num_workers=3)
    with pytest.raises(ValueError, match=r"^Train source 'b' has 5 rows, fewer than its 6 shards \(world_size=2 x "
                                         r"num_workers=3\): some workers would get no data\."):
        config.build(train_managers(corpus_dir), {"a": documents(20, 0), "b": documents(5, 50)}.__getitem__, 0, 2)


def test_normalised_weights_are_shares_of_the_total(corpus_dir):
    assert normalised_weights(train_managers(corpus_dir)) == {"a": 0.75, "b": 0.25}


def test_the_datamodules_stream_is_the_configs_stream_over_its_loaded_data(corpus_dir, tmp_path):
    datamodule = ready(TextDataModule(dataset_managers=managers(corpus_dir), cache_dir=str(tmp_path), seed=3,
                                      max_seq_len=24, packing="concat", multidataset_stopping_strategy="all_exhausted"))
    config = TrainStreamConfig(seed=3, max_seq_len=24, overlong="truncate", stopping_strategy="all_exhausted",
                               mix_by="documents", stream_name="interleaved", packing="concat", packing_buffer_size=64,
                               num_workers=0)
    loaded = datamodule._datasets["train"]
    expected = config.build(datamodule.dataset_managers["train"], loaded.__getitem__, rank=1, world_size=2)
    collate = datamodule.train_collator()
    got = datamodule.build_train_stream(rank=1, world_size=2)
    first, second = collate(list(itertools.islice(iter(got), 8))), collate(list(itertools.islice(iter(expected), 8)))
    assert first.keys() == second.keys()
    assert all(torch.equal(first[key], second[key]) for key in first if key != "provenance")
    assert first["provenance"] == second["provenance"]


def test_overlong_documents_are_warned_about_per_source_unless_the_packer_splits_them():
    with pytest.warns(UserWarning) as caught:
        warn_overlong_documents(DATA, max_seq_len=4, overlong="drop", packing="best_fit")
    lines = [str(warning.message) for warning in caught]
    assert len(lines) == 2 and lines[0].startswith("Train source 'a': ") and lines[1].startswith("Train source 'b': ")
    assert all("overlong='drop'" in line for line in lines)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_overlong_documents(DATA, max_seq_len=4, overlong="drop", packing="concat")
        warn_overlong_documents(DATA, max_seq_len=64, overlong="drop", packing=None)
