"""One rank's train stream: every train manager's source -> interleaved by weight -> [packed].

The run-wide values every stage shares (seed, rank, world size, passes, the sources' length limit,
the overlong policy) travel as one :class:`~lightning_tune_data.settings.StreamSettings` per rank,
built here; the sources, the mixer and the packer take their values from that one object.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from lightning_tune_data.managers import DatasetManager
from lightning_tune_data.mixing.interleave import InterleavedDataset
from lightning_tune_data.mixing.timeline import WeightTimeline
from lightning_tune_data.packing import IterablePackedDataset, get_strategy
from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.arrow import ArrowSource
from lightning_tune_data.sources.base import TuneIterableDataset
from lightning_tune_data.sources.corpus_source import CorpusSource
from lightning_tune_data.formats.corpus import TokenCorpus
from lightning_tune_data.formats.ranged import RangedCorpus
from lightning_tune_data.sources.lengths import overlong_warnings

__all__ = [
    "TrainStreamConfig",
    "normalised_weights",
    "packing_splits_documents",
    "warn_overlong_documents",
]


def packing_splits_documents(packing: str | None) -> bool:
    """Whether the ``packing`` strategy splits a long document across rows itself.

    Sources then hand documents out whole (no ``max_seq_len`` cut, no overlong warning): the
    packer keeps every token.

    Args:
        packing: the packing strategy's name, or ``None`` (no packing).
    """
    return packing is not None and get_strategy(packing).splits_documents


def warn_overlong_documents(
    datasets: Mapping[str, Any], max_seq_len: int, overlong: str, packing: str | None
) -> None:
    """Warn, per train source, how many documents the overlong policy will cut or drop.

    Nothing is cut when the packer splits long documents itself.

    Args:
        datasets: the loaded train datasets by name (their cached lengths are read).
        max_seq_len: the longest document a source hands out.
        overlong: ``"truncate"`` or ``"drop"``.
        packing: the packing strategy's name, or ``None``.
    """
    if packing_splits_documents(packing):
        return
    for line in overlong_warnings(datasets, max_seq_len, overlong):
        rank_zero_warn(line)


def normalised_weights(managers: Mapping[str, DatasetManager]) -> dict[str, float]:
    """Every train manager's ``weight`` as its share of the mix (the shares sum to 1).

    Args:
        managers: the train managers by name (their weights are checked: finite, >= 0, not all 0).
    """
    weights = {name: float(manager.weight) for name, manager in managers.items()}
    total = sum(weights.values())
    return {name: weight / total for name, weight in weights.items()}


@dataclass(frozen=True)
class TrainStreamConfig:
    """What the datamodule's config says about its train stream, for :meth:`build`.

    Args:
        seed: seeds every shuffle, mixture draw and packer.
        max_seq_len: longest row a batch may hold (tokens).
        overlong: what a source does with a longer document: ``"truncate"`` or ``"drop"``.
        stopping_strategy: ``"infinite"`` (sources restart), ``"first_exhausted"`` or
            ``"all_exhausted"`` (one pass over each source).
        mix_by: what the managers' weights are shares of: ``"documents"`` or ``"tokens"``.
        stream_name: name of the mixture when several sources are interleaved.
        packing: ``None`` (no packing) or the packing strategy's name.
        packing_buffer_size: open packs (not documents) ``best_fit`` keeps and places into.
        num_workers: dataloader workers per rank (each reads its own shard of every source).
        timeline: the mixture's weights over the run (a schedule or caps; ``None``: the managers' weights).
    """

    seed: int
    max_seq_len: int
    overlong: str
    stopping_strategy: str
    mix_by: str
    stream_name: str
    packing: str | None
    packing_buffer_size: int
    num_workers: int
    timeline: WeightTimeline | None = None

    def settings(self, rank: int = 0, world_size: int = 1) -> StreamSettings:
        """The settings rank ``rank`` of ``world_size`` shares with every stage of its stream.

        Args:
            rank, world_size: the rank's place in the run.
        """
        return StreamSettings(
            seed=self.seed,
            rank=rank,
            world_size=world_size,
            num_passes=None if self.stopping_strategy == "infinite" else 1,
            max_seq_len=None if packing_splits_documents(self.packing) else self.max_seq_len,
            overlong=self.overlong,
        )

    def build(
        self, managers: Mapping[str, DatasetManager], dataset_of: Callable[[str], Any], rank: int = 0,
        world_size: int = 1,
    ) -> TuneIterableDataset:
        """Sources -> interleave by weight -> [pack]: the stream one rank's train loader reads.

        Args:
            managers: the train managers by name, in config order.
            dataset_of: the loaded (set up) dataset of a manager, by name.
            rank, world_size: this rank's place in the run.
        """
        settings = self.settings(rank, world_size)
        sources = [self._source(name, manager, dataset_of(name), settings) for name, manager in managers.items()]
        if len(sources) == 1 and self.stopping_strategy == "infinite" and self.timeline is None:
            stream = sources[0]
        else:
            weights = [float(managers[source.dataset_name].weight) for source in sources]
            if self.timeline is not None:
                weights = list(self.timeline.weights(0))
            stream = InterleavedDataset(sources, weights, dataset_name=self.stream_name,
                                        stopping_strategy=self.stopping_strategy, mix_by=self.mix_by,
                                        settings=settings, timeline=self.timeline)
        if self.packing is not None:
            stream = IterablePackedDataset(stream, max_seq_len=self.max_seq_len, strategy=self.packing,
                                           buffer_size=self.packing_buffer_size, settings=settings)
        return stream

    def _source(self, name: str, manager: DatasetManager, data: Any, settings: StreamSettings) -> TuneIterableDataset:
        if getattr(manager, "streaming", False):
            from lightning_tune_data.sources.hf_streaming import HFStreamingSource

            return HFStreamingSource(data, dataset_name=name, shuffle=manager.shuffle,
                                     max_error_count=manager.max_error_count, settings=settings,
                                     **manager.stream_options())
        shards = settings.world_size * max(1, self.num_workers)
        if 0 < len(data) < shards:  # fail before any dataloader worker starts (0 rows: ArrowSource says so)
            raise ValueError(
                f"Train source '{name}' has {len(data)} rows, fewer than its {shards} shards (world_size="
                f"{settings.world_size} x num_workers={self.num_workers}): some workers would get no data. Lower "
                "num_workers or add data."
            )
        kind = CorpusSource if isinstance(data, (TokenCorpus, RangedCorpus)) else ArrowSource
        return kind(data, dataset_name=name, shuffle=manager.shuffle, max_error_count=manager.max_error_count,
                    settings=settings, **manager.stream_transforms())
