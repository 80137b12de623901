"""Preparing a config's token stores without training, as tasks any scheduler can run.

``prepare_task(config, i, n)`` runs task ``i`` of ``n`` of every cached source of the config (the
same split of each source's inputs on every machine, so the tasks can run anywhere, in any order,
any number of times); the task that finishes a store last commits it. ``finalize_stores(config)``
commits the stores whose tasks all finished (for schedulers that run a last step). This is the
entry point for Ray, Dask, Spark or Kubernetes jobs; ``lightning-tune-data prepare`` calls it for
Slurm arrays, torchrun and the local engine.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping

from typing import Any

from lightning_tune_data.cache.tasks import StoreNotCommittedError
from lightning_tune_data.datamodule.module import TextDataModule
from lightning_tune_data.datamodule.splits import SPLITS
from lightning_tune_data.managers import TokenizedDatasetManager, UnconditionalGenerationDatasetManager
from lightning_tune_data.managers.store_repair import repair_source_store
from lightning_tune_data.managers.store_task import finalize_source_store, run_store_task

__all__ = ["finalize_stores", "prepare_task", "repair_stores", "stored_sources"]

log = logging.getLogger("lightning_tune_data.managers")
ConfigLike = str | os.PathLike[str] | Mapping[str, Any] | TextDataModule


def _datamodule(config: ConfigLike, cache_dir: str | None) -> TextDataModule:
    if isinstance(config, TextDataModule):
        return config
    from lightning_tune_data.report.batches import datamodule_from_config

    if isinstance(config, Mapping) and "data" not in config and "dataset_managers" in config:
        config = {"data": config}  # the data: section alone, as the docstrings promise
    return datamodule_from_config(config, cache_dir=cache_dir)


def stored_sources(datamodule: TextDataModule) -> Iterator[tuple[str, Any]]:
    """``("<split>/<name>", manager)`` for every source that has a token store, in config order."""
    for split in SPLITS:
        for name, manager in (datamodule.dataset_managers.get(split) or {}).items():
            read_in_place = isinstance(manager, (UnconditionalGenerationDatasetManager, TokenizedDatasetManager))
            if not read_in_place and not manager.streaming:
                yield f"{split}/{name}", manager


def prepare_task(config: ConfigLike, task_index: int, num_tasks: int, cache_dir: str | None = None) -> dict[str, str]:
    """Run task ``task_index`` of ``num_tasks`` for every stored source of ``config``.

    Task ``i`` of ``n`` reads a fixed part of each source (a run of whole files, or a range of
    rows), writes its shards and its done-marker under fixed paths of the store, and commits the
    store when every task is done. Rerunning a finished task does nothing; rerunning a killed one
    writes it again. The stores' rows and tokens do not depend on ``num_tasks``.

    Args:
        config: A ``lightning-tune-data fit`` YAML config (path), its ``data:`` section as a
            mapping, or a ``TextDataModule``.
        task_index: This task, ``0 <= task_index < num_tasks``.
        num_tasks: How many tasks split the work (the same for every task of a store).
        cache_dir: Overrides the config's ``data.cache_dir``.

    Returns:
        ``{"<split>/<name>": what happened}`` per source.
    """
    datamodule = _datamodule(config, cache_dir)
    sources = [(label, manager, datamodule.store_root.with_url(manager.options.cache_dir))
               for label, manager in stored_sources(datamodule)]
    for url, root in {root.url: root for _, _, root in sources}.items():
        root.check(writable=True)  # a mistyped bucket or missing credentials fail before any tokenization
    results: dict[str, str] = {}
    for label, manager, root in sources:
        results[label] = run_store_task(manager, datamodule.tokenizer, root, task_index, num_tasks)
        log.info("%s: task %d of %d: %s", manager.source_description, task_index, num_tasks, results[label])
    return results


def repair_stores(config: ConfigLike, cache_dir: str | None = None) -> dict[str, str]:
    """Verify every file of every committed store of ``config``; redo only the tasks whose files fail.

    Args:
        config: As for :func:`prepare_task`.
        cache_dir: Overrides the config's ``data.cache_dir``.

    Returns:
        ``{"<split>/<name>": "intact (...)" | "repaired: ..."}``.

    Raises:
        StoreNotCommittedError: A store is not committed, or cannot be repaired (named, with the fix).
    """
    datamodule = _datamodule(config, cache_dir)
    return {label: repair_source_store(manager, datamodule.tokenizer,
                                       datamodule.store_root.with_url(manager.options.cache_dir))
            for label, manager in stored_sources(datamodule)}


def finalize_stores(config: ConfigLike, cache_dir: str | None = None) -> dict[str, str]:
    """Commit every stored source of ``config`` whose tasks all finished.

    Args:
        config: As for :func:`prepare_task`.
        cache_dir: Overrides the config's ``data.cache_dir``.

    Returns:
        ``{"<split>/<name>": "committed" | "committed before"}``.

    Raises:
        StoreNotCommittedError: Stores have unfinished tasks or none at all (every one of them named).
    """
    datamodule = _datamodule(config, cache_dir)
    results: dict[str, str] = {}
    unfinished: list[str] = []
    for label, manager in stored_sources(datamodule):
        try:
            results[label] = finalize_source_store(manager, datamodule.tokenizer,
                                                   datamodule.store_root.with_url(manager.options.cache_dir))
        except StoreNotCommittedError as error:
            unfinished.append(str(error))
    if unfinished:  # every unfinished store named, not only the first
        count = len(unfinished)
        raise StoreNotCommittedError(f"{count} store{'s are' if count != 1 else ' is'} not committed: "
                                     + " | ".join(unfinished))
    return results


