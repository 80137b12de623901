"""Bad configuration fails early and clearly, naming the field: before any dataloader worker
starts where possible (issue 7, DESIGN decision 8)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import make_texts, write_jsonl
from lightning.pytorch import Trainer

from lightning_tune_data import LocalDatasetManager, TextDataModule
from lightning_tune_data.cli import run_cli
from lightning_tune_data.managers import DataSourceError
from lightning_tune_data.models import TinyCausalLM
from lightning_tune_data.mixing.interleave import InterleavedDataset
from lightning_tune_data.sources.memory import InMemoryStream


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    write_jsonl(tmp_path / "a.jsonl", make_texts(30, seed=1, prefix="A"))
    write_jsonl(tmp_path / "b.jsonl", make_texts(30, seed=2, prefix="B"))
    return tmp_path


def manager(data_dir: Path, name: str = "a", **kwargs) -> LocalDatasetManager:
    return LocalDatasetManager(data_files=str(data_dir / f"{name}.jsonl"), **kwargs)


def datamodule(data_dir: Path, managers: dict | None = None, **options) -> TextDataModule:
    options = {"max_seq_len": 32, "batch_size": 2, "num_workers": 0, "seed": 0, **options}
    managers = managers or {"a": manager(data_dir)}
    return TextDataModule(dataset_managers={"train": managers}, cache_dir=str(data_dir / "cache"), **options)


def trainer(max_steps: int, **kwargs) -> Trainer:
    return Trainer(accelerator="cpu", max_steps=max_steps, logger=False, enable_progress_bar=False,
                   enable_model_summary=False, limit_val_batches=0, **kwargs)


def tiny_model(dm: TextDataModule) -> TinyCausalLM:
    return TinyCausalLM(vocab_size=dm.vocab_size, max_seq_len=dm.max_seq_len, d_model=16, n_layers=1, n_heads=2)


# -- weights --------------------------------------------------------------------------------
@pytest.mark.parametrize("weight", [-0.5, math.nan, math.inf])
def test_negative_or_non_finite_weight_is_rejected_by_the_manager_naming_weight(data_dir, weight):
    with pytest.raises(DataSourceError, match=rf"a.jsonl.*weight must be a finite number >= 0, got {weight}"):
        manager(data_dir, weight=weight)


def test_weights_summing_to_zero_are_rejected_by_the_datamodule_naming_the_sources(data_dir):
    zero = {"a": manager(data_dir, weight=0.0), "b": manager(data_dir, "b", weight=0.0)}
    with pytest.raises(ValueError, match=r"dataset_managers.train: weights \{'a': 0.0, 'b': 0.0\} sum to 0"):
        datamodule(data_dir, zero)


@pytest.mark.parametrize(("weights", "message"), [([1.0, -1.0], "weight -1.0 of child 'b' is invalid"),
                                                  ([1.0, math.nan], "weight nan of child 'b' is invalid"),
                                                  ([0.0, 0.0], "sum to 0")])
def test_interleaved_dataset_rejects_bad_weights_naming_the_child(weights, message):
    children = [InMemoryStream([[1, 2]], dataset_name=name) for name in ("a", "b")]
    with pytest.raises(ValueError, match=message):
        InterleavedDataset(children, weights, seed=0)


def write_config(path: Path, data_dir: Path, train_block: str, data_extra: str = "") -> Path:
    path.write_text(f"""
trainer: {{accelerator: cpu, max_steps: 1, logger: false, enable_checkpointing: false,
          enable_progress_bar: false, enable_model_summary: false, limit_val_batches: 0}}
model:
  class_path: lightning_tune_data.models.TinyCausalLM
  init_args: {{d_model: 16, n_layers: 1, n_heads: 2}}
data:
  max_seq_len: 32
  batch_size: 2
  cache_dir: {data_dir / "cache"}{data_extra}
  dataset_managers:
    train:
{train_block}""")
    return path


def train_entry(name: str, data_file: Path, extra: str = "") -> str:
    return (f"      {name}:\n        class_path: lightning_tune_data.LocalDatasetManager\n"
            f"        init_args: {{data_files: {data_file}{extra}}}\n")


def test_negative_weight_in_a_yaml_config_fails_naming_source_and_weight(data_dir):
    config = write_config(data_dir / "c.yaml", data_dir, train_entry("a", data_dir / "a.jsonl", ", weight: -1"))
    with pytest.raises(ValueError, match=r"a.jsonl.*weight must be a finite number >= 0, got -1.0"):
        run_cli(["fit", "--config", str(config)])
    assert not (data_dir / "cache").exists()  # failed before preparing any data


# -- duplicates and unknown keys ----------------------------------------------------------
def test_duplicate_child_names_in_an_interleaved_dataset_are_rejected():
    children = [InMemoryStream([[1, 2]], dataset_name="same"), InMemoryStream([[3, 4]], dataset_name="same")]
    with pytest.raises(ValueError, match=r"duplicate child dataset names \['same'\]"):
        InterleavedDataset(children, [0.5, 0.5], seed=0)


def test_duplicate_source_name_in_a_yaml_config_is_an_error_not_last_one_wins(data_dir, capsys):
    block = train_entry("a", data_dir / "a.jsonl") + train_entry("a", data_dir / "b.jsonl")
    config = write_config(data_dir / "c.yaml", data_dir, block)
    with pytest.raises(SystemExit) as info:
        run_cli(["fit", "--config", str(config)])
    assert info.value.code != 0
    assert "duplicate key 'a'" in capsys.readouterr().err


def test_duplicate_names_derived_from_the_list_form_are_rejected(data_dir):
    with pytest.raises(ValueError, match=r"duplicate source names \['a'\]"):
        TextDataModule(dataset_managers={"train": [manager(data_dir), manager(data_dir)]},
                       cache_dir=str(data_dir / "cache"))


@pytest.mark.parametrize(
    ("where", "name"),
    [("manager", "wieght"), ("data", "bacth_size")],
)
def test_unknown_config_key_fails_naming_it(data_dir, capsys, where, name):
    if where == "manager":
        config = write_config(data_dir / "c.yaml", data_dir, train_entry("a", data_dir / "a.jsonl", f", {name}: 3"))
    else:
        config = write_config(data_dir / "c.yaml", data_dir, train_entry("a", data_dir / "a.jsonl"),
                              data_extra=f"\n  {name}: 3")
    with pytest.raises(SystemExit) as info:
        run_cli(["fit", "--config", str(config)])
    assert info.value.code != 0
    assert name in capsys.readouterr().err
    assert not (data_dir / "cache").exists()


# -- loader and packing options -----------------------------------------------------------
@pytest.mark.timeout(120)
def test_more_workers_than_rows_fails_before_any_worker_starts(tmp_path):
    write_jsonl(tmp_path / "tiny.jsonl", ["one", "two", "three"])
    tiny = LocalDatasetManager(data_files=str(tmp_path / "tiny.jsonl"))
    dm = TextDataModule(dataset_managers={"train": {"tiny": tiny}}, max_seq_len=16, batch_size=1, num_workers=4,
                        cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ValueError, match=r"Train source 'tiny' has 3 rows, fewer than its 4 shards .*num_workers=4"):
        trainer(2).fit(tiny_model(dm), datamodule=dm)


@pytest.mark.parametrize("field", ["batch_size", "eval_batch_size"])
def test_batch_size_below_one_is_rejected_naming_the_field(data_dir, field):
    with pytest.raises(ValueError, match=rf"TextDataModule.{field}: 0 < 1"):
        datamodule(data_dir, **{field: 0})


@pytest.mark.parametrize("packing", [None, "greedy", "best_fit", "concat"])
def test_max_seq_len_without_room_for_bos_and_eos_is_rejected(data_dir, packing):
    with pytest.raises(ValueError, match=r"TextDataModule.max_seq_len: 1 is too small.*BOS and EOS"):
        datamodule(data_dir, packing=packing, max_seq_len=1)


@pytest.mark.parametrize("packing", ["greedy", "best_fit", "concat"])
def test_smallest_allowed_max_seq_len_packs_rows_of_at_most_two_tokens(data_dir, packing):
    dm = datamodule(data_dir, packing=packing, max_seq_len=2)
    dm.prepare_data()
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_ids"].shape == (2, 2)
    assert (batch["labels"] != -100).sum() >= 1


# -- resuming with an incompatible checkpoint --------------------------------------------
def fit_and_checkpoint(dm: TextDataModule, path: Path, steps: int = 3) -> Path:
    run = trainer(steps, enable_checkpointing=False)
    run.fit(tiny_model(dm), datamodule=dm)
    run.save_checkpoint(path)
    return path


def test_resume_with_other_train_sources_fails_naming_the_sources(data_dir):
    ckpt = fit_and_checkpoint(datamodule(data_dir), data_dir / "a.ckpt")
    renamed = datamodule(data_dir, {"renamed": manager(data_dir)})
    with pytest.raises(ValueError, match=r"data config changed \(sources: checkpoint \['a'\] -> now \['renamed'\]\)"):
        trainer(5).fit(tiny_model(renamed), datamodule=renamed, ckpt_path=str(ckpt))


def test_resume_after_the_data_file_changed_fails_naming_source_and_row_counts(data_dir):
    ckpt = fit_and_checkpoint(datamodule(data_dir), data_dir / "a.ckpt")
    write_jsonl(data_dir / "a.jsonl", make_texts(35, seed=1, prefix="A"))  # 5 more rows
    changed = datamodule(data_dir)
    changed_rows = r"Source 'a': the checkpoint was written for 30 rows but the cache now has 35"
    with pytest.raises(ValueError, match=changed_rows):
        trainer(5).fit(tiny_model(changed), datamodule=changed, ckpt_path=str(ckpt))


def test_resume_from_a_checkpoint_of_another_state_version_fails_naming_the_version(data_dir):
    ckpt = fit_and_checkpoint(datamodule(data_dir), data_dir / "a.ckpt")
    content = torch.load(ckpt, weights_only=True)
    content["TextDataModule"]["version"] = 99
    torch.save(content, ckpt)
    dm = datamodule(data_dir)
    with pytest.raises(ValueError, match="train data state has version 99.*resume_data_state: false"):
        trainer(5).fit(tiny_model(dm), datamodule=dm, ckpt_path=str(ckpt))


def test_resume_from_a_checkpoint_without_data_state_warns_that_data_restarts(data_dir):
    ckpt = fit_and_checkpoint(datamodule(data_dir), data_dir / "a.ckpt")
    content = torch.load(ckpt, weights_only=True)
    del content["TextDataModule"]  # e.g. written by another datamodule
    torch.save(content, ckpt)
    dm = datamodule(data_dir)
    run = trainer(5, enable_checkpointing=False)
    with pytest.warns(UserWarning, match="holds no TextDataModule data state.*starts from the beginning"):
        run.fit(tiny_model(dm), datamodule=dm, ckpt_path=str(ckpt))
    assert run.global_step == 5
