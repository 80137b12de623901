"""Splits, the Lightning stages that read them, and the names of their managers and dataloaders.

A manager's name is what errors, metrics and the model use to tell sources apart: the key of the
mapping form (``train: {web: manager}``), or, in the list form, one derived from the manager's
data (the first data file's stem, else the dataset's name). Every val/test/predict manager is one
dataloader with that name; the train split is one stream, named after its only manager or
``train_stream_name`` when several are mixed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning_tune_data.managers import DatasetManager, UnconditionalGenerationDatasetManager

__all__ = [
    "EVAL_SPLITS",
    "SPLITS",
    "SPLITS_FOR_STAGE",
    "STAGE_TO_SPLIT",
    "dataloader_name",
    "dataloader_names",
    "default_source_name",
    "named_managers",
    "tell_managers_their_names",
]

SPLITS = ("train", "val", "test", "predict")
#: Splits read by plain, never-shuffled loaders, one per manager.
EVAL_SPLITS = ("val", "test", "predict")
#: Lightning stage names (and common aliases) -> split names.
STAGE_TO_SPLIT = {
    "fit": "train",
    "train": "train",
    "training": "train",
    "validate": "val",
    "validation": "val",
    "val": "val",
    "test": "test",
    "predict": "predict",
}
#: Which manager ``stages`` make a split load in ``setup(stage)``.
SPLITS_FOR_STAGE = {"fit": ("train", "val"), "validate": ("val",), "test": ("test",), "predict": ("predict",)}


def default_source_name(manager: Any) -> str:
    """Name of a manager given in list form: the first data file's stem, else the dataset's name.

    Args:
        manager: a dataset manager (its ``source_name`` wins where it has one).
    """
    if isinstance(manager, UnconditionalGenerationDatasetManager):
        return "unconditional"
    if getattr(manager, "source_name", None):
        return manager.source_name
    files = manager.data_files
    if isinstance(files, dict):
        files = next(iter(files.values()), None)
    if isinstance(files, (list, tuple)):
        files = files[0] if files else None
    if files:
        return Path(str(files)).stem
    parts = [str(manager.path).rstrip("/").split("/")[-1], manager.name]
    return "_".join(p for p in parts if p)


def named_managers(split: str, managers: Any) -> Any:
    """Normalise the list form of a split (``train: [manager, ...]``) to ``{name: manager}``.

    Anything else is returned as given (the config checks then say what is wrong with it).

    Args:
        split: the split's name (for the error).
        managers: the split's managers, as configured.

    Raises:
        ValueError: two managers of the list derive the same name.
    """
    if not isinstance(managers, (list, tuple)):
        return managers
    names = [default_source_name(m) if isinstance(m, DatasetManager) else repr(m) for m in managers]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(
            f"TextDataModule.dataset_managers.{split}: duplicate source names {duplicates} (derived from the "
            f"data files / dataset names of {names}). Use the mapping form {{name: manager}} to name them."
        )
    return dict(zip(names, managers))


def tell_managers_their_names(dataset_managers: Mapping[str, Mapping[str, Any]]) -> None:
    """Set every manager's ``source_name`` to its name in the config, so its errors name it as the config does.

    Args:
        dataset_managers: ``{split: {name: manager}}``.
    """
    for managers in dataset_managers.values():
        for name, manager in managers.items():
            manager.source_name = name


def dataloader_names(dataset_managers: Mapping[str, Mapping[str, Any]], train_stream_name: str) -> dict[str, list[str]]:
    """``{split: [names in dataloader_idx order]}``; train has the one stream's name.

    Args:
        dataset_managers: ``{split: {name: manager}}`` (a split may be missing or empty).
        train_stream_name: the train stream's name when several train managers are mixed.
    """
    train = list(dataset_managers.get("train") or {})
    names = {"train": train if len(train) <= 1 else [train_stream_name]}
    for split in EVAL_SPLITS:
        names[split] = list(dataset_managers.get(split) or {})
    return names


def dataloader_name(names: Mapping[str, list[str]], stage: str, idx: int = 0) -> str:
    """Name of dataloader ``idx`` of ``stage`` (``fit``/``train``, ``validate``/``val``, ...) in ``names``.

    Args:
        names: ``{split: [names in dataloader_idx order]}`` (:func:`dataloader_names`).
        stage: a Lightning stage or split name.
        idx: the dataloader's index in that stage.

    Raises:
        ValueError: ``stage`` is no known stage or split name.
        IndexError: the split has no dataloader ``idx``.
    """
    split = STAGE_TO_SPLIT.get(stage)
    if split is None:
        raise ValueError(f"Unknown stage '{stage}'; use one of {sorted(STAGE_TO_SPLIT)}.")
    split_names = names[split]
    if not 0 <= idx < len(split_names):
        raise IndexError(f"No {split} dataloader at index {idx}; the {split} dataloaders are {split_names}.")
    return split_names[idx]
