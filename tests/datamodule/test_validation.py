"""The datamodule's config checks: every wrong constructor value fails at construction, naming its field."""

from __future__ import annotations

from typing import Any

import pytest
from datamodule_config import managers

from lightning_tune_data import LocalDatasetManager, TextDataModule, UnconditionalGenerationDatasetManager
from lightning_tune_data.cache.checksums import VERIFY_MODES
from lightning_tune_data.datamodule.validation import validated_managers
from lightning_tune_data.keys import MIX_BY, OVERLONG_POLICIES, STOPPING_STRATEGIES
from lightning_tune_data.packing.packer import PACKING_STRATEGIES


def values(**changes: Any) -> dict[str, Any]:
    """Valid keyword arguments of ``validated_managers``, with ``changes`` applied."""
    return {"max_seq_len": 16, "batch_size": 2, "eval_batch_size": 2, "num_workers": 0, "packing": None,
            "stopping_strategy": "infinite", "train_mode": "stream", "overlong": "truncate", "mix_by": "documents",
            "cache_verify": "checksum", **changes}


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"train": {}}, "dataset_managers: no split has a manager"),
        ({"training": {}}, "unknown split 'training'"),
        ({"train": {"": None}}, "empty or non-string dataloader name"),
        ({"train": {"a": "not a manager"}}, r"dataset_managers\.train\.a"),
    ],
)
def test_bad_manager_config_names_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        TextDataModule(dataset_managers=bad)


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"max_seq_len": 1}, "max_seq_len"),
        ({"packing": "tetris"}, "packing"),
        ({"multidataset_stopping_strategy": "never"}, "multidataset_stopping_strategy"),
        ({"num_workers": -1}, "num_workers"),
        ({"train_mode": "map", "packing": "greedy"}, "train_mode"),
    ],
)
def test_bad_options_name_the_field(corpus_dir, options, field):
    with pytest.raises(ValueError, match=field):
        TextDataModule(dataset_managers=managers(corpus_dir), **options)


@pytest.mark.parametrize("weight", [-1.0, float("nan"), float("inf")])
def test_bad_weight_names_the_source(corpus_dir, weight):
    config = managers(corpus_dir)
    config["train"]["b"].weight = weight
    with pytest.raises(ValueError, match=r"train\.b\.weight"):
        TextDataModule(dataset_managers=config)


def test_weights_that_sum_to_zero_are_an_error(corpus_dir):
    config = managers(corpus_dir)
    for manager in config["train"].values():
        manager.weight = 0.0
    with pytest.raises(ValueError, match="sum to 0"):
        TextDataModule(dataset_managers=config)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"cache_verify": "md5"}, "TextDataModule.cache_verify: 'md5' is not 'checksum' or 'size' or 'full'. Use 'checksum' "
                                  "(hash a cache file again only when it changed since it was verified), 'full' "
                                  "(hash every file whenever the cache is reused) or 'size' (compare file sizes only)."),
        ({"overlong": "keep"}, "TextDataModule.overlong: unknown policy 'keep'. Use 'truncate' or 'drop'."),
        ({"mix_by": "bytes"}, "TextDataModule.mix_by: unknown value 'bytes'. Use one of ['documents', 'tokens']."),
        ({"packing": "tetris"}, "TextDataModule.packing: unknown strategy 'tetris'. Use null or one of "
                                "['greedy', 'best_fit', 'concat']."),
        ({"stopping_strategy": "never"}, "TextDataModule.multidataset_stopping_strategy: unknown strategy 'never'. "
                                         "Use one of ['infinite', 'first_exhausted', 'all_exhausted']."),
        ({"eval_batch_size": 0}, "TextDataModule.eval_batch_size: 0 < 1. Use a batch size of at least 1."),
        ({"num_workers": -2}, "TextDataModule.num_workers: -2 < 0. Use 0 (main process) or more workers."),
        ({"max_seq_len": 1}, "TextDataModule.max_seq_len: 1 is too small. Use at least 2 (room for BOS and EOS)."),
        ({"train_mode": "map", "packing": "greedy"}, "TextDataModule.train_mode: 'map' needs exactly one train "
                                                     "manager and no packing. Use train_mode: stream for mixtures and packing."),
    ],
)
def test_each_wrong_value_fails_with_its_field_problem_and_fix(corpus_dir, changes, message):
    with pytest.raises(ValueError) as error:
        validated_managers(managers(corpus_dir), **values(**changes))
    assert str(error.value) == message


@pytest.mark.parametrize(
    ("field", "allowed"),
    [("packing", PACKING_STRATEGIES), ("stopping_strategy", STOPPING_STRATEGIES), ("overlong", OVERLONG_POLICIES),
     ("mix_by", MIX_BY), ("cache_verify", VERIFY_MODES)],
)
def test_every_allowed_value_of_the_shared_lists_is_accepted(corpus_dir, field, allowed):
    for value in allowed:
        assert set(validated_managers(managers(corpus_dir), **values(**{field: value}))) == {"train", "val"}


def test_a_predict_only_manager_under_train_is_an_error_naming_it(corpus_dir):
    config = {"train": {"prompts": UnconditionalGenerationDatasetManager(num_examples=2)}}
    with pytest.raises(ValueError, match=r"^TextDataModule.dataset_managers.train.prompts: "
                                         r"UnconditionalGenerationDatasetManager is predict-only\. Move it"):
        validated_managers(config, **values())


def test_managers_that_are_not_a_dict_of_splits_are_an_error():
    with pytest.raises(ValueError, match=r"^TextDataModule.dataset_managers: expected a dict of splits, got list\."):
        validated_managers([], **values())


def test_the_list_form_comes_back_named_and_the_mapping_form_as_given(corpus_dir):
    a, b = (LocalDatasetManager(data_files=str(corpus_dir / f"{name}.jsonl")) for name in "ab")
    val = managers(corpus_dir)["val"]
    named = validated_managers({"train": [a, b], "val": val}, **values())
    assert named == {"train": {"a": a, "b": b}, "val": val}
    assert named["val"] is val


def test_the_cache_check_comes_before_the_names_of_the_list_form(corpus_dir):
    same = str(corpus_dir / "a.jsonl")
    duplicates = {"train": [LocalDatasetManager(data_files=same), LocalDatasetManager(data_files=same)]}
    with pytest.raises(ValueError, match="cache_verify"):
        validated_managers(duplicates, **values(cache_verify="md5"))
    with pytest.raises(ValueError, match="duplicate source names"):
        validated_managers(duplicates, **values())


def test_the_datamodule_checks_its_values_at_construction_with_the_same_messages(corpus_dir):
    with pytest.raises(ValueError, match=r"^TextDataModule.overlong: unknown policy 'keep'\. Use 'truncate' or 'drop'\.$"):
        TextDataModule(dataset_managers=managers(corpus_dir), overlong="keep")
    with pytest.raises(ValueError, match=r"^TextDataModule.cache_verify: 'md5' is not 'checksum' or 'size' or 'full'\."):
        TextDataModule(dataset_managers=managers(corpus_dir), cache_verify="md5")
