"""The val/test/predict loaders: one plain, never-shuffled loader per manager, in config order.

Each rank reads its own contiguous block of every eval dataset (see
:class:`~lightning_tune_data.loading.loaders.EvalDocuments`); the unconditional-generation prompts
are split by their manager instead. Every loader pads one document per row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from lightning_tune_data.collate import PaddedCollator
from lightning_tune_data.distributed import current_rank_and_world_size
from lightning_tune_data.keys import SOURCE
from lightning_tune_data.loading.loaders import EvalDocuments, LoaderOptions, build_eval_loader
from lightning_tune_data.managers import UnconditionalGenerationDatasetManager
from lightning_tune_data.tokenizers import Tokenizer

__all__ = ["eval_loaders"]


def eval_loaders(
    managers: Mapping[str, Any],
    dataset_of: Callable[[str], Any],
    *,
    tokenizer: Tokenizer,
    cache_dir: Path,
    max_seq_len: int,
    pad_to_multiple_of: int | None,
    options: LoaderOptions,
) -> list[DataLoader]:
    """One loader per manager of an eval split, in ``managers`` order (the ``dataloader_idx`` order).

    Args:
        managers: the split's managers by name.
        dataset_of: the loaded (set up) dataset of a manager, by name.
        tokenizer: gives the pad id, and tokenizes the unconditional prompts.
        cache_dir: where the unconditional prompts' manager caches them.
        max_seq_len: longer documents are cut to their first ``max_seq_len`` tokens.
        pad_to_multiple_of: round padded lengths up to a multiple of this.
        options: the eval dataloader options.
    """
    rank, world_size = current_rank_and_world_size()
    collator = PaddedCollator(pad_id=tokenizer.pad_id, max_seq_len=max_seq_len, pad_to_multiple_of=pad_to_multiple_of)
    loaders = []
    for name, manager in managers.items():
        if isinstance(manager, UnconditionalGenerationDatasetManager):
            prompts = manager.setup(tokenizer, cache_dir)
            indices = manager.examples_for_rank(rank, world_size)
            data = [dict(prompts[i], **{SOURCE: name}) for i in indices]
            dataset = EvalDocuments(data, name, rank=0, world_size=1, max_seq_len=max_seq_len)
        else:
            dataset = EvalDocuments(dataset_of(name), name, rank, world_size, max_seq_len)
        loaders.append(build_eval_loader(dataset, collator, options))
    return loaders
