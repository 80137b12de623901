"""TrainMixture: the datamodule's schedule, the managers' caps, the plan at setup; and its helpers."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_tune_data import LocalDatasetManager, TextDataModule
from lightning_tune_data.datamodule.train_mixture import TrainMixture, pack_fill
from lightning_tune_data.managers.errors import DataSourceError


def managers(corpus_dir, **caps) -> dict:
    return {name: LocalDatasetManager(data_files=str(corpus_dir / f"{name}.jsonl"), **caps.get(name, {}))
            for name in "ab"}


def test_pack_fill_is_measured_per_strategy_from_a_sample_of_lengths() -> None:
    rng = np.random.default_rng(0)
    lengths = {"a": rng.integers(20, 200, 500), "b": rng.integers(50, 600, 500)}
    fills = {s: pack_fill(lengths, {"a": 0.5, "b": 0.5}, s, 512, 64, documents=3000) for s in ("concat", "best_fit",
                                                                                                 "greedy")}
    assert fills["concat"] == 1.0 and 0.95 < fills["best_fit"] < 1.0 and fills["greedy"] < fills["best_fit"]
    assert pack_fill(lengths, {"a": 0.5, "b": 0.5}, "best_fit", 512, 64, documents=3000) == fills["best_fit"]


def test_caps_are_checked_on_the_manager(corpus_dir) -> None:
    manager = LocalDatasetManager(data_files=str(corpus_dir / "a.jsonl"), max_epochs=1.5, max_tokens="2M")
    assert (manager.max_epochs, manager.max_tokens) == (1.5, 2e6)
    with pytest.raises(DataSourceError, match="max_epochs must be a number > 0"):
        LocalDatasetManager(data_files=str(corpus_dir / "a.jsonl"), max_epochs=0)
    with pytest.raises(DataSourceError, match="max_tokens: '2 GB' is not a count"):
        LocalDatasetManager(data_files=str(corpus_dir / "a.jsonl"), max_tokens="2 GB")


def test_without_a_schedule_or_a_cap_nothing_changes(corpus_dir) -> None:
    mixture = TrainMixture(None, managers(corpus_dir), "documents")
    assert not mixture.active and mixture.describe() is None and mixture.targets_at(3) is None


def test_a_schedule_naming_another_source_fails_at_construction(corpus_dir, tmp_path) -> None:
    with pytest.raises(ValueError, match=r"\['c'\] are not train sources"):
        TextDataModule({"train": managers(corpus_dir)}, cache_dir=str(tmp_path),
                       mix_schedule={"points": [{"at": 0, "weights": {"a": 1, "c": 1}}]})


def test_fractions_of_a_run_in_tokens_need_packing(corpus_dir, tmp_path) -> None:
    dm = TextDataModule({"train": managers(corpus_dir)}, cache_dir=str(tmp_path), max_seq_len=64, mix_schedule={
        "unit": "tokens", "points": [{"at": 0, "weights": {"a": 1}}, {"at": 1.0, "weights": {"b": 1}}]})
    dm.prepare_data()
    with pytest.raises(ValueError, match="with unit 'tokens' need packing"):
        dm.setup("fit")


def test_a_cap_alone_plans_the_managers_weights_without_a_trainer(corpus_dir, tmp_path, capsys) -> None:
    dm = TextDataModule({"train": managers(corpus_dir, b={"max_tokens": 500})}, cache_dir=str(tmp_path), max_seq_len=64,
                        batch_size=4)
    dm.prepare_data()
    dm.setup("fit")
    plan = dm.mixture.plan
    assert plan is not None and plan.steps is None and "500 tokens" in capsys.readouterr().out
    b = plan.sources[1]
    assert b.tokens == pytest.approx(500) and b.cap_step is not None
    assert dm.mixture.targets_at(b.cap_step + 1) == {"a": 1.0, "b": 0.0}
    assert dm.mixture.describe() and "caps=" in dm.mixture.describe()
