"""Splits and names: the list form's derived source names, dataloader names per split, stage lookup."""

from __future__ import annotations

import pytest
from datamodule_config import managers

from lightning_tune_data import (
    DatasetManager,
    LocalDatasetManager,
    TextDataModule,
    UnconditionalGenerationDatasetManager,
)
from lightning_tune_data.datamodule.splits import (
    STAGE_TO_SPLIT,
    dataloader_name,
    dataloader_names,
    default_source_name,
    named_managers,
    tell_managers_their_names,
)


def test_list_form_of_weighted_sources_is_named_after_the_files(corpus_dir):
    datamodule = TextDataModule(
        dataset_managers={
            "train": [
                LocalDatasetManager(data_files=str(corpus_dir / "a.jsonl"), weight=0.8),
                LocalDatasetManager(data_files=str(corpus_dir / "b.jsonl"), weight=0.2),
            ]
        },
        multidataset_stopping_strategy="first_exhausted",
    )
    assert list(datamodule.dataset_managers["train"]) == ["a", "b"]
    assert datamodule.train_source_weights == {"a": 0.8, "b": 0.2}


def test_list_form_with_duplicate_names_lists_them(corpus_dir):
    same = str(corpus_dir / "a.jsonl")
    with pytest.raises(ValueError, match=r"duplicate source names \['a'\]"):
        TextDataModule(dataset_managers={"train": [LocalDatasetManager(data_files=same), LocalDatasetManager(data_files=same)]})


def test_dataloader_names_follow_config_order_and_resolve_by_stage(corpus_dir):
    datamodule = TextDataModule(
        dataset_managers=managers(
            corpus_dir,
            lm=LocalDatasetManager(data_files=str(corpus_dir / "val.jsonl")),
            other=LocalDatasetManager(data_files=str(corpus_dir / "b.jsonl")),
        )
    )
    assert datamodule.dataloader_names == {"train": ["interleaved"], "val": ["lm", "other"], "test": [], "predict": []}
    assert datamodule.dataloader_name("validate", 1) == "other"
    assert datamodule.dataloader_name("fit") == "interleaved"
    assert datamodule.train_source_weights == {"a": 0.75, "b": 0.25}
    with pytest.raises(IndexError, match=r"\['lm', 'other'\]"):
        datamodule.dataloader_name("val", 2)
    with pytest.raises(ValueError, match="Unknown stage"):
        datamodule.dataloader_name("tune")


def test_single_train_source_names_the_train_loader_after_it(corpus_dir):
    datamodule = TextDataModule(dataset_managers={"train": {"lm": LocalDatasetManager(data_files=str(corpus_dir / "a.jsonl"))}})
    assert datamodule.dataloader_names["train"] == ["lm"]


def test_a_source_in_list_form_is_named_after_its_first_data_file_or_its_dataset(corpus_dir):
    a, b = str(corpus_dir / "a.jsonl"), str(corpus_dir / "b.jsonl")
    assert default_source_name(LocalDatasetManager(data_files=a)) == "a"
    assert default_source_name(LocalDatasetManager(data_files=[b, a])) == "b"
    assert default_source_name(LocalDatasetManager(data_files={"train": [a, b]})) == "a"
    assert default_source_name(DatasetManager(path="org/wiki", name="en", split="train")) == "wiki_en"
    assert default_source_name(DatasetManager(path="org/wiki", split="train")) == "wiki"
    assert default_source_name(UnconditionalGenerationDatasetManager(num_examples=2)) == "unconditional"


def test_named_managers_keeps_the_mapping_form_and_names_the_list_form_in_order(corpus_dir):
    mapping = managers(corpus_dir)["train"]
    assert named_managers("train", mapping) is mapping
    a, b = (LocalDatasetManager(data_files=str(corpus_dir / f"{name}.jsonl")) for name in "ba")
    assert list(named_managers("val", [a, b]).items()) == [("b", a), ("a", b)]
    with pytest.raises(ValueError, match=r"^TextDataModule.dataset_managers.val: duplicate source names \['b'\]"):
        named_managers("val", [a, a])


def test_managers_are_told_their_config_names(corpus_dir):
    config = managers(corpus_dir)
    tell_managers_their_names(config)
    assert [manager.source_name for manager in config["train"].values()] == ["a", "b"]
    assert config["val"]["lm"].source_name == "lm"


def test_dataloader_names_and_their_lookup_by_stage_alias():
    names = dataloader_names({"train": {"a": 1, "b": 2}, "test": {"t": 3}, "val": None}, "mix")
    assert names == {"train": ["mix"], "val": [], "test": ["t"], "predict": []}
    assert dataloader_names({"train": {"only": 1}}, "mix")["train"] == ["only"]
    for stage, split in STAGE_TO_SPLIT.items():
        if names[split]:
            assert dataloader_name(names, stage) == names[split][0]
    with pytest.raises(IndexError, match=r"^No val dataloader at index 0; the val dataloaders are \[\]\.$"):
        dataloader_name(names, "validation")
    with pytest.raises(ValueError, match=r"^Unknown stage 'tune'; use one of \["):
        dataloader_name(names, "tune")
