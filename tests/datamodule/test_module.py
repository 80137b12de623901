"""TextDataModule: config validation, lifecycle, names, and the dataloader selection table."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler

from lightning_tune_data import (
    ByteTokenizer,
    LocalDatasetManager,
    TextDataModule,
    UnconditionalGenerationDatasetManager,
)
from lightning_tune_data.loading.resumable_loader import ResumableLoader


def managers(corpus_dir: Path, **val) -> dict:
    return {
        "train": {
            "a": LocalDatasetManager(data_files=str(corpus_dir / "a.jsonl"), weight=3.0),
            "b": LocalDatasetManager(data_files=str(corpus_dir / "b.jsonl"), weight=1.0),
        },
        "val": val or {"lm": LocalDatasetManager(data_files=str(corpus_dir / "val.jsonl"))},
    }


def ready(datamodule: TextDataModule, stage: str = "fit") -> TextDataModule:
    datamodule.prepare_data()
    datamodule.setup(stage)
    return datamodule


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


def test_fit_without_train_managers_is_an_error_naming_the_split(corpus_dir, tmp_path):
    datamodule = TextDataModule(dataset_managers={"val": {"lm": LocalDatasetManager(data_files=str(corpus_dir / "val.jsonl"))}},
                                cache_dir=str(tmp_path / "cache"))
    assert datamodule.dataloader_names["train"] == []
    with pytest.raises(ValueError, match=r"dataset_managers.train: `fit` needs at least one train manager .*it configures \['val'\]"):
        datamodule.setup("fit")


@pytest.mark.parametrize(("stage", "split"), [("test", "test"), ("predict", "predict"), ("validate", "val")])
def test_stage_without_its_split_is_an_error_naming_the_split(corpus_dir, tmp_path, stage, split):
    datamodule = TextDataModule(dataset_managers={"train": managers(corpus_dir)["train"]}, cache_dir=str(tmp_path / "c"))
    with pytest.raises(ValueError, match=rf"dataset_managers.{split}: `{stage}` needs at least one {split} manager"):
        datamodule.setup(stage)


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


def test_train_loader_is_a_resumable_stateful_dataloader_with_drop_last(corpus_dir, tmp_path):
    datamodule = ready(TextDataModule(dataset_managers=managers(corpus_dir), cache_dir=str(tmp_path), batch_size=4))
    loader = datamodule.train_dataloader()
    assert isinstance(loader, ResumableLoader)
    assert isinstance(loader.loader, StatefulDataLoader)
    assert loader.loader.drop_last
    assert not hasattr(loader, "state_dict"), "Lightning must not save the (prefetched) loader state itself"
    batch = next(iter(loader))
    assert batch["input_ids"].shape[0] == 4 and batch["input_ids"].dtype == torch.long
    assert set(batch["provenance"]["source"]) <= {"a", "b"}


def _finite_train_loader(corpus_dir: Path, tmp_path: Path) -> ResumableLoader:
    datamodule = TextDataModule(dataset_managers=managers(corpus_dir), cache_dir=str(tmp_path), batch_size=4,
                                multidataset_stopping_strategy="first_exhausted")
    return ready(datamodule).train_dataloader()


def assert_same_batches(got: list[dict], expected: list[dict]) -> None:
    assert len(got) == len(expected) > 0
    for batch, reference in zip(got, expected):
        assert batch.keys() == reference.keys()
        for key, value in reference.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(batch[key], value), key
            else:
                assert batch[key] == value, key


def test_in_process_train_loader_hands_out_the_stateful_dataloaders_own_batches(corpus_dir, tmp_path):
    # The in-process loader takes each batch from the StatefulDataLoader's iterator without its
    # per-batch profiler range: the same batches, the same end (drop_last), the same random draws.
    torch.manual_seed(0)
    direct = list(_finite_train_loader(corpus_dir, tmp_path / "direct").loader)
    rng_after_direct = torch.get_rng_state()
    torch.manual_seed(0)
    resumable = _finite_train_loader(corpus_dir, tmp_path / "resumable")
    assert_same_batches(list(resumable), direct)
    assert torch.equal(torch.get_rng_state(), rng_after_direct)
    assert resumable.batches_yielded == len(direct)


def test_train_loader_under_a_profiler_records_its_batches_and_hands_out_the_same_ones(corpus_dir, tmp_path):
    expected = list(_finite_train_loader(corpus_dir, tmp_path / "plain"))
    loader = _finite_train_loader(corpus_dir, tmp_path / "profiled")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        got = list(loader)
    assert_same_batches(got, expected)
    ranges = [event.name for event in profiler.events() if event.name.startswith("enumerate(DataLoader)")]
    assert len(ranges) >= len(expected)


def test_map_style_train_uses_a_seeded_stateful_random_sampler(corpus_dir, tmp_path):
    config = {"train": {"a": LocalDatasetManager(data_files=str(corpus_dir / "a.jsonl"))}}
    datamodule = ready(TextDataModule(dataset_managers=config, cache_dir=str(tmp_path), train_mode="map", batch_size=4))
    loader = datamodule.train_dataloader()
    assert isinstance(loader.loader.sampler, RandomSampler)
    first = [b["input_ids"] for b, _ in zip(loader, range(3))]
    again = ready(TextDataModule(dataset_managers=config, cache_dir=str(tmp_path), train_mode="map", batch_size=4))
    second = [b["input_ids"] for b, _ in zip(again.train_dataloader(), range(3))]
    assert all(torch.equal(x, y) for x, y in zip(first, second))


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


def test_eval_rows_are_split_across_ranks_without_duplicates(corpus_dir, tmp_path):
    from lightning_tune_data.loading.loaders import EvalDocuments

    datamodule = ready(TextDataModule(dataset_managers=managers(corpus_dir), cache_dir=str(tmp_path)), "validate")
    dataset = datamodule._loaded("val", "lm")
    shards = [list(EvalDocuments(dataset, "lm", rank, 3)) for rank in range(3)]
    sizes = [len(s) for s in shards]
    assert sum(sizes) == 13 and max(sizes) - min(sizes) <= 1
    flat = [tuple(d["input_ids"].tolist()) for shard in shards for d in shard]
    assert len(set(flat)) == 13


def test_setup_honours_manager_stages(corpus_dir, tmp_path):
    config = managers(corpus_dir)
    config["test"] = {"held_out": LocalDatasetManager(data_files=str(corpus_dir / "val.jsonl"), stages=["test"])}
    datamodule = TextDataModule(dataset_managers=config, cache_dir=str(tmp_path))
    datamodule.prepare_data()
    datamodule.setup("fit")
    assert "held_out" not in datamodule._datasets["test"]
    datamodule.setup("test")
    assert len(datamodule.test_dataloader()) == 1


def test_predict_with_unconditional_prompts_yields_bos_only_rows(corpus_dir, tmp_path):
    config = managers(corpus_dir)
    config["predict"] = {"unconditional": UnconditionalGenerationDatasetManager(num_examples=6)}
    datamodule = ready(TextDataModule(dataset_managers=config, cache_dir=str(tmp_path), eval_batch_size=4), "predict")
    (loader,) = datamodule.predict_dataloader()
    batches = list(loader)
    assert sum(b["input_ids"].shape[0] for b in batches) == 6
    assert all((b["input_ids"][:, 0] == ByteTokenizer.bos_id).all() for b in batches)
    assert datamodule.dataloader_names["predict"] == ["unconditional"]


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


def test_finite_first_exhausted_mix_ends_the_epoch(corpus_dir, tmp_path):
    config = managers(corpus_dir)
    datamodule = ready(
        TextDataModule(dataset_managers=config, cache_dir=str(tmp_path), batch_size=4, multidataset_stopping_strategy="first_exhausted")
    )
    batches = list(datamodule.train_dataloader())
    counts = {"a": 0, "b": 0}
    for batch in batches:
        for source in batch["provenance"]["source"]:
            counts[source] += 1
    assert counts["a"] <= 61 and counts["b"] <= 47
    # The stream stopped because one source ran out: that source is complete up to the at most
    # batch_size - 1 documents that drop_last removed from the final partial batch.
    assert counts["a"] >= 61 - 3 or counts["b"] >= 47 - 3
    assert 0 < len(batches) < (61 + 47) // 4
