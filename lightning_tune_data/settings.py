"""Run-wide settings that every stage of one rank's train stream shares, in one frozen object.

The datamodule builds a :class:`StreamSettings` once per rank and hands the same object to every
source, the mixer and the packer, instead of passing the same half-dozen arguments to each.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from lightning_tune_data.keys import OVERLONG_POLICIES, OverlongPolicy

__all__ = ["StreamSettings"]


@dataclass(frozen=True)
class StreamSettings:
    """What one rank's train stream needs to know about the whole run.

    Args:
        seed: Seeds every shuffle, mixture draw and packer of the run.
        rank: This process's rank (``0`` outside distributed runs).
        world_size: Number of ranks.
        num_passes: Passes over each source before it ends (``None``: infinite, every source
            restarts with a new order).
        max_seq_len: Longest document a source hands out (``None``: no limit, e.g. when the packer
            splits documents itself).
        overlong: What a source does with a longer document: ``"truncate"`` or ``"drop"``.
    """

    seed: int = 0
    rank: int = 0
    world_size: int = 1
    num_passes: int | None = None
    max_seq_len: int | None = None
    overlong: OverlongPolicy = "truncate"

    def __post_init__(self) -> None:
        if self.overlong not in OVERLONG_POLICIES:
            raise ValueError(f"overlong={self.overlong!r}; use one of {list(OVERLONG_POLICIES)}.")
        if self.num_passes is not None and self.num_passes < 1:
            raise ValueError(f"num_passes must be >= 1 or None, got {self.num_passes}.")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is outside world_size {self.world_size}.")

    def with_changes(self, **changes: object) -> StreamSettings:
        """A copy with ``changes`` applied (the object itself never changes)."""
        return replace(self, **changes)
