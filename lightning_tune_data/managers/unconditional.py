"""``UnconditionalGenerationDatasetManager``: BOS-only prompts for unconditional generation."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset as TorchDataset

from lightning_tune_data.keys import EPOCH, INPUT_IDS, SOURCE
from lightning_tune_data.managers.errors import DataSourceError
from lightning_tune_data.managers.hub import DatasetManager
from lightning_tune_data.managers.options import SourceOptions, validate_stages
from lightning_tune_data.tokenizers import Tokenizer

__all__ = ["UnconditionalGenerationDatasetManager", "UnconditionalPrompts"]


class UnconditionalPrompts(TorchDataset):
    """``num_examples`` BOS-only prompts for unconditional generation (map-style, indexable).

    Item ``i`` is ``{"input_ids": np.array([bos_id]), "source": source, "epoch": 0, "index": k}``
    where ``k`` is the global example index (``indices[i]``).

    Args:
        bos_id: The tokenizer's BOS id.
        indices: Global example indices this object serves (a ``range`` for one rank's block).
        source: Source name reported with every sample.
    """

    def __init__(self, bos_id: int, indices: Sequence[int], source: str) -> None:
        self.bos_id = int(bos_id)
        self.indices = indices
        self.source = source

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int) -> dict[str, Any]:
        return {
            INPUT_IDS: np.array([self.bos_id], dtype=np.int64),
            SOURCE: self.source,
            EPOCH: 0,
            "index": int(self.indices[position]),
        }

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for position in range(len(self)):
            yield self[position]


class UnconditionalGenerationDatasetManager(DatasetManager):
    """Prompts for unconditional generation: ``num_examples`` samples holding only BOS.

    Nothing is downloaded or cached. Under DDP, use :meth:`examples_for_rank` (or
    ``setup(..., rank=, world_size=)``) to give each rank a disjoint block, so no prompt is
    generated twice (a padding ``DistributedSampler`` would repeat some).

    Args:
        num_examples: Number of prompts (>= 1).
        stages: Trainer stages this source is used in (default: all).
    """

    def __init__(self, num_examples: int, stages: list[str] | None = None) -> None:
        if not isinstance(num_examples, int) or isinstance(num_examples, bool) or num_examples < 1:
            raise DataSourceError(
                f"UnconditionalGenerationDatasetManager: num_examples must be an integer >= 1, "
                f"got {num_examples!r}."
            )
        self.num_examples = num_examples
        self.full_name = None
        self.path = None
        self.name = None
        self.split = None
        self.data_files = None
        self.source_name = None
        self.options = SourceOptions(
            stages=validate_stages(stages, "UnconditionalGenerationDatasetManager"), shuffle=False
        )

    def _source_label(self) -> str:
        return f"unconditional generation, num_examples={self.num_examples}"

    def _source_spec(self, memo_dir: str | Path | None) -> dict[str, Any]:
        return {"num_examples": self.num_examples}

    def cache_dir_for(self, tokenizer: Tokenizer, cache_dir: str | Path) -> Path:
        """Not applicable: unconditional prompts are never cached.

        Args:
            tokenizer: Unused.
            cache_dir: Unused.
        """
        raise DataSourceError(f"{self.source_description} has no cache (nothing to preprocess).")

    def examples_for_rank(self, rank: int, world_size: int) -> list[int]:
        """Indices of the prompts rank ``rank`` generates: a contiguous block.

        Blocks of all ranks cover ``0..num_examples-1`` exactly once; sizes differ by at most one
        (the first ``num_examples % world_size`` ranks get one more).

        Args:
            rank: This process's rank, ``0 <= rank < world_size``.
            world_size: Number of ranks.
        """
        return list(self._block(rank, world_size))

    def _block(self, rank: int, world_size: int) -> range:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}.")
        base, extra = divmod(self.num_examples, world_size)
        start = rank * base + min(rank, extra)
        return range(start, start + base + (1 if rank < extra else 0))

    def prepare_data(self, tokenizer: Tokenizer, cache_dir: str | Path | None = None) -> Path | None:
        """Nothing to prepare; returns ``None``.

        Args:
            tokenizer: Unused (accepted for a uniform manager interface).
            cache_dir: Unused.
        """
        return None

    def setup(
        self,
        tokenizer: Tokenizer,
        cache_dir: str | Path | None = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> UnconditionalPrompts:
        """Return the prompts of ``rank`` (all of them with the default ``world_size=1``).

        Args:
            tokenizer: Supplies ``bos_id``.
            cache_dir: Unused (accepted for a uniform manager interface).
            rank: This process's rank.
            world_size: Number of ranks sharing the prompts.
        """
        return UnconditionalPrompts(
            tokenizer.bos_id, self._block(rank, world_size), self.source_name or "unconditional"
        )

    def __repr__(self) -> str:
        return (
            f"UnconditionalGenerationDatasetManager(num_examples={self.num_examples}, "
            f"stages={self.stages})"
        )
