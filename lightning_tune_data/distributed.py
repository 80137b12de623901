"""Where am I? Rank and dataloader-worker coordinates used to shard and seed streams."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch.distributed as dist
from torch.utils.data import get_worker_info


@dataclass(frozen=True)
class ShardInfo:
    """Coordinates of one data shard: a (rank, dataloader worker) pair.

    ``shard_id = rank * num_workers + worker_id`` and ``num_shards = world_size * num_workers``.
    """

    rank: int = 0
    world_size: int = 1
    worker_id: int = 0
    num_workers: int = 1

    @property
    def shard_id(self) -> int:
        return self.rank * self.num_workers + self.worker_id

    @property
    def num_shards(self) -> int:
        return self.world_size * self.num_workers


def current_rank_and_world_size() -> tuple[int, int]:
    """Rank and world size of the default process group, ``(0, 1)`` when not distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def current_shard(rank: int, world_size: int) -> ShardInfo:
    """Shard of the calling process: call it inside ``__iter__``/``load_state_dict`` (worker side).

    ``rank``/``world_size`` must be captured in the main process (workers have no process group).
    """
    info = get_worker_info()
    if info is None:
        return _shard_info(rank, world_size, 0, 1)
    return _shard_info(rank, world_size, info.id, info.num_workers)


@functools.lru_cache(maxsize=64)
def _shard_info(rank: int, world_size: int, worker_id: int, num_workers: int) -> ShardInfo:
    """One (frozen, shared) ShardInfo per coordinates: streams ask for theirs on every batch."""
    return ShardInfo(rank=rank, world_size=world_size, worker_id=worker_id, num_workers=num_workers)
