"""The managers' data: prepared once per node, set up per stage, looked up by split and name.

``prepare_data`` writes every manager's cache (download, preprocess, tokenize); ``setup`` loads the
caches a Lightning stage needs (memory-mapped), skipping managers whose ``stages`` exclude it. The
loaded datasets live in a ``{split: {name: dataset}}`` mapping the datamodule owns.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from lightning_tune_data.cache.checksums import VerifyMode
from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.datamodule.splits import SPLITS, SPLITS_FOR_STAGE
from lightning_tune_data.managers import UnconditionalGenerationDatasetManager
from lightning_tune_data.tokenizers import Tokenizer

__all__ = ["close_datasets", "loaded_dataset", "prepare_datasets", "set_up_datasets"]

log = logging.getLogger(__name__)


def prepare_datasets(
    dataset_managers: Mapping[str, Mapping[str, Any]], tokenizer: Tokenizer, cache_dir: StoreRoot | str | os.PathLike[str],
    cache_verify: VerifyMode,
) -> None:
    """Download, preprocess and cache every manager's data, split by split in config order.

    The unconditional-generation prompts need no cache: they are built when their loader is.

    Args:
        dataset_managers: ``{split: {name: manager}}``.
        tokenizer: tokenizes every source.
        cache_dir: where the caches are written (a source's own ``cache_dir`` moves its store).
        cache_verify: how a reused cache is checked: ``"checksum"`` or ``"size"``.
    """
    for split in SPLITS:
        for name, manager in (dataset_managers.get(split) or {}).items():
            if isinstance(manager, UnconditionalGenerationDatasetManager):
                continue
            log.debug("Preparing %s/%s", split, name)  # the cache prints one line per source
            manager.prepare_data(tokenizer, _root(cache_dir, manager, split, dataset_managers), cache_verify=cache_verify)


def _root(cache_dir: StoreRoot | str | os.PathLike[str], manager: Any, split: str,
          dataset_managers: Mapping[str, Mapping[str, Any]]) -> StoreRoot:
    """Where ``manager``'s store is: its own ``cache_dir`` or the datamodule's; only train stores
    are read through a ``cache_budget``, which the node's train stores share (evaluation stores
    are small and read again and again)."""
    root = StoreRoot.of(cache_dir).with_url(manager.options.cache_dir)
    if split != "train":
        return root.unbudgeted()
    train = [m for m in (dataset_managers.get("train") or {}).values()
             if not isinstance(m, UnconditionalGenerationDatasetManager)]
    return root.shared_by(len(train))


def set_up_datasets(
    datasets: dict[str, dict[str, Any]],
    dataset_managers: Mapping[str, Mapping[str, Any]],
    stage: str | None,
    tokenizer: Tokenizer,
    cache_dir: StoreRoot | str | os.PathLike[str],
) -> None:
    """Load into ``datasets[split][name]`` every cache ``stage`` needs (all stages when ``None``).

    A manager whose ``stages`` exclude the stage is skipped; one already loaded is kept.

    Args:
        datasets: ``{split: {name: dataset}}``, filled in place.
        dataset_managers: ``{split: {name: manager}}``.
        stage: ``fit``, ``validate``, ``test``, ``predict`` or ``None``.
        tokenizer: the tokenizer the caches were built with.
        cache_dir: where the caches are (a source's own ``cache_dir`` moves its store).
    """
    stages = SPLITS_FOR_STAGE.keys() if stage is None else [stage]
    for lightning_stage in stages:
        for split in SPLITS_FOR_STAGE.get(lightning_stage, ()):
            for name, manager in (dataset_managers.get(split) or {}).items():
                if lightning_stage not in manager.stages or name in datasets[split]:
                    continue
                datasets[split][name] = manager.setup(tokenizer, _root(cache_dir, manager, split, dataset_managers))


def close_datasets(datasets: Mapping[str, Mapping[str, Any]]) -> None:
    """Let go of what the datasets of this process hold beyond their files: a store read shard by
    shard stops its node cache's prefetch threads and drops its pins and mappings (a notebook, or
    a sweep of trials in one process, then ends each run clean). A dataset used again afterwards
    starts them again.

    Args:
        datasets: ``{split: {name: dataset}}``.
    """
    for of_split in datasets.values():
        for dataset in of_split.values():
            close = getattr(dataset, "close", None)
            if callable(close):
                close()


def loaded_dataset(datasets: Mapping[str, Mapping[str, Any]], split: str, name: str) -> Any:
    """The loaded dataset of manager ``name`` of ``split``.

    Args:
        datasets: ``{split: {name: dataset}}``.
        split, name: the manager's split and name.

    Raises:
        RuntimeError: it was not set up, naming the calls that load it.
    """
    try:
        return datasets[split][name]
    except KeyError:
        raise RuntimeError(
            f"{split} dataset '{name}' is not set up. Call prepare_data() and setup() first (the Trainer "
            "does), and check the manager's `stages`."
        ) from None
