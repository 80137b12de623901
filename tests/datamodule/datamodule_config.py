"""Datamodule configs the datamodule tests share: two weighted train sources and a val source."""

from __future__ import annotations

from pathlib import Path

from lightning_tune_data import LocalDatasetManager, TextDataModule


def managers(corpus_dir: Path, **val) -> dict:
    """``train``: ``a`` (weight 3) and ``b`` (weight 1); ``val``: ``lm``, or the managers given."""
    return {
        "train": {
            "a": LocalDatasetManager(data_files=str(corpus_dir / "a.jsonl"), weight=3.0),
            "b": LocalDatasetManager(data_files=str(corpus_dir / "b.jsonl"), weight=1.0),
        },
        "val": val or {"lm": LocalDatasetManager(data_files=str(corpus_dir / "val.jsonl"))},
    }


def ready(datamodule: TextDataModule, stage: str = "fit") -> TextDataModule:
    """``datamodule`` after ``prepare_data()`` and ``setup(stage)``."""
    datamodule.prepare_data()
    datamodule.setup(stage)
    return datamodule
