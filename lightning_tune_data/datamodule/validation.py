"""The checks ``TextDataModule`` makes on its constructor's values, before anything is built.

Every error starts with the field's path under the datamodule (``TextDataModule.<field>: ...``),
says what is wrong and how to fix it; the CLI turns the prefix into the config path
(``data.<field>``). Checking at construction means a bad config fails before any data is read.
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

from lightning_tune_data.cache.checksums import VERIFY_MODES
from lightning_tune_data.datamodule.splits import SPLITS, named_managers
from lightning_tune_data.keys import MIX_BY, OVERLONG_POLICIES, STOPPING_STRATEGIES
from lightning_tune_data.managers import DatasetManager, UnconditionalGenerationDatasetManager
from lightning_tune_data.packing import strategy_names

__all__ = ["validated_managers"]


def _fail(field: str, problem: str, fix: str) -> NoReturn:
    raise ValueError(f"TextDataModule.{field}: {problem}. {fix}")


def _either(values: tuple[str, ...]) -> str:
    """``'a' or 'b'``: the allowed values as an error message lists them."""
    return " or ".join(repr(value) for value in values)


def validated_managers(
    dataset_managers: Any,
    *,
    max_seq_len: int,
    batch_size: int,
    eval_batch_size: int,
    num_workers: int,
    packing: str | None,
    stopping_strategy: str,
    train_mode: str,
    overlong: str,
    mix_by: str,
    cache_verify: str,
) -> dict[str, dict[str, DatasetManager | UnconditionalGenerationDatasetManager]]:
    """Check the datamodule's constructor values; return the managers as ``{split: {name: manager}}``.

    Args:
        dataset_managers: the constructor's ``dataset_managers`` (splits in mapping or list form).
        max_seq_len, batch_size, num_workers, packing, overlong, mix_by, cache_verify: the
            constructor's values of the same name.
        eval_batch_size: the eval batch size in effect (``batch_size`` when none was given).
        stopping_strategy: the constructor's ``multidataset_stopping_strategy``.
        train_mode: ``"stream"`` or ``"map"``.

    Raises:
        ValueError: ``TextDataModule.<field>: <problem>. <fix>`` for the first value that is wrong.
    """
    if cache_verify not in VERIFY_MODES:
        raise ValueError(
            f"TextDataModule.cache_verify: {cache_verify!r} is not {_either(VERIFY_MODES)}. Use 'checksum' "
            "(hash a cache file again only when it changed since it was verified), 'full' (hash every file "
            "whenever the cache is reused) or 'size' (compare file sizes only)."
        )
    if isinstance(dataset_managers, dict):
        dataset_managers = {split: named_managers(split, managers) for split, managers in dataset_managers.items()}
    _check_managers(dataset_managers)
    train = dataset_managers.get("train") or {}
    _check_train_weights(train)
    if max_seq_len < 2:
        _fail("max_seq_len", f"{max_seq_len} is too small", "Use at least 2 (room for BOS and EOS).")
    for field, size in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
        if size < 1:
            _fail(field, f"{size} < 1", "Use a batch size of at least 1.")
    if num_workers < 0:
        _fail("num_workers", f"{num_workers} < 0", "Use 0 (main process) or more workers.")
    if packing is not None and packing not in strategy_names():
        _fail("packing", f"unknown strategy {packing!r}", f"Use null or one of {list(strategy_names())}.")
    if stopping_strategy not in STOPPING_STRATEGIES:
        _fail("multidataset_stopping_strategy", f"unknown strategy {stopping_strategy!r}",
              f"Use one of {list(STOPPING_STRATEGIES)}.")
    if train_mode == "map" and (len(train) != 1 or packing is not None):
        _fail("train_mode", "'map' needs exactly one train manager and no packing",
              "Use train_mode: stream for mixtures and packing.")
    if overlong not in OVERLONG_POLICIES:
        _fail("overlong", f"unknown policy {overlong!r}", f"Use {_either(OVERLONG_POLICIES)}.")
    if mix_by not in MIX_BY:
        _fail("mix_by", f"unknown value {mix_by!r}", f"Use one of {list(MIX_BY)}.")
    return dataset_managers


def _check_managers(dataset_managers: Any) -> None:
    """Splits are known, every manager is named and is a manager, and some split has one."""
    if not isinstance(dataset_managers, dict):
        _fail("dataset_managers", f"expected a dict of splits, got {type(dataset_managers).__name__}",
              "Use {train: {name: manager}, val: {...}}.")
    for split, managers in dataset_managers.items():
        if split not in SPLITS:
            _fail(f"dataset_managers.{split}", f"unknown split '{split}'", f"Use one of {list(SPLITS)}.")
        if not isinstance(managers, dict):
            _fail(f"dataset_managers.{split}", "expected a dict of {name: manager}",
                  "Give every manager a name, e.g. {lm: {class_path: ...}}.")
        for name, manager in managers.items():
            if not isinstance(name, str) or not name.strip():
                _fail(f"dataset_managers.{split}", f"empty or non-string dataloader name {name!r}",
                      "Name every manager with a non-empty string.")
            if not isinstance(manager, (DatasetManager, UnconditionalGenerationDatasetManager)):
                _fail(f"dataset_managers.{split}.{name}", f"expected a DatasetManager, got {type(manager).__name__}",
                      "Use lightning_tune_data.DatasetManager / LocalDatasetManager.")
    if not any(dataset_managers.values()):
        _fail("dataset_managers", "no split has a manager",
              "Add managers under dataset_managers.train (and val/test/predict).")


def _check_train_weights(train: dict[str, Any]) -> None:
    """Train managers can be mixed: none is predict-only, weights are finite, >= 0, not all 0."""
    for name, manager in train.items():
        if isinstance(manager, UnconditionalGenerationDatasetManager):
            _fail(f"dataset_managers.train.{name}", "UnconditionalGenerationDatasetManager is predict-only",
                  "Move it under dataset_managers.predict.")
    weights = {name: float(m.weight) for name, m in train.items()}
    for name, weight in weights.items():
        if not math.isfinite(weight) or weight < 0:
            _fail(f"dataset_managers.train.{name}.weight", f"weight {weight} is not a finite number >= 0",
                  "Give every train source a non-negative weight.")
    if train and sum(weights.values()) <= 0:
        _fail("dataset_managers.train", f"weights {weights} sum to 0", "Give at least one source a positive weight.")
