"""The managers' data: prepared for every split, set up per stage (honouring each manager's stages),
looked up by split and name with an error that says how to load it."""

from __future__ import annotations

import pytest
from datamodule_config import managers

from lightning_tune_data import ByteTokenizer, LocalDatasetManager, TextDataModule, UnconditionalGenerationDatasetManager
from lightning_tune_data.datamodule.manager_data import loaded_dataset, prepare_datasets, set_up_datasets
from lightning_tune_data.datamodule.splits import SPLITS


def test_setup_honours_manager_stages(corpus_dir, tmp_path):
    config = managers(corpus_dir)
    config["test"] = {"held_out": LocalDatasetManager(data_files=str(corpus_dir / "val.jsonl"), stages=["test"])}
    datamodule = TextDataModule(dataset_managers=config, cache_dir=str(tmp_path))
    datamodule.prepare_data()
    datamodule.setup("fit")
    assert "held_out" not in datamodule._datasets["test"]
    datamodule.setup("test")
    assert len(datamodule.test_dataloader()) == 1


def test_each_stage_loads_its_splits_and_none_loads_every_stage(corpus_dir, tmp_path):
    config = managers(corpus_dir)
    config["test"] = {"held_out": LocalDatasetManager(data_files=str(corpus_dir / "val.jsonl"), stages=["test"])}
    config["predict"] = {"unconditional": UnconditionalGenerationDatasetManager(num_examples=3)}
    tokenizer = ByteTokenizer()
    prepare_datasets(config, tokenizer, tmp_path, "checksum")
    loaded: dict[str, dict] = {split: {} for split in SPLITS}
    set_up_datasets(loaded, config, "validate", tokenizer, tmp_path)
    assert {split: list(names) for split, names in loaded.items()} == {"train": [], "val": ["lm"], "test": [],
                                                                       "predict": []}
    val = loaded["val"]["lm"]
    set_up_datasets(loaded, config, None, tokenizer, tmp_path)
    assert {split: list(names) for split, names in loaded.items()} == {"train": ["a", "b"], "val": ["lm"],
                                                                       "test": ["held_out"], "predict": ["unconditional"]}
    assert loaded["val"]["lm"] is val  # set up once
    assert len(loaded_dataset(loaded, "train", "a")) == 61


def test_prepare_caches_every_split_but_the_unconditional_prompts(corpus_dir, tmp_path):
    config = managers(corpus_dir)
    config["predict"] = {"unconditional": UnconditionalGenerationDatasetManager(num_examples=3)}
    prepare_datasets(config, ByteTokenizer(), tmp_path / "cache", "size")
    builds = sorted(path.name.split("-")[0] for path in (tmp_path / "cache").iterdir() if path.suffix != ".lock"
                    and "-train-" in path.name)
    assert builds == ["a", "b", "val"]
    assert not any("unconditional" in path.name for path in (tmp_path / "cache").iterdir())


def test_a_dataset_not_set_up_is_an_error_saying_how_to_load_it():
    with pytest.raises(RuntimeError, match=r"^val dataset 'lm' is not set up\. Call prepare_data\(\) and setup\(\) "
                                           r"first \(the Trainer does\), and check the manager's `stages`\.$"):
        loaded_dataset({"val": {}}, "val", "lm")
