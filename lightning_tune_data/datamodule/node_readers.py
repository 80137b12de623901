"""How many processes of this node read each train store: what a budgeted store's windows are sized for.

A store read through the node's ``cache_budget`` is read by every local rank's dataloader
workers (or the rank itself without workers), and they share the node's cache. Each keeps the
shards of its shuffle window, so the windows are sized for all of them
(:func:`~lightning_tune_data.cache.window_plan.plan_window`).
"""

from __future__ import annotations

import os
from typing import Any

from lightning_tune_data.cache.root import StoreRoot

__all__ = ["local_ranks", "node_readers", "node_root"]


def local_ranks(trainer: Any = None) -> int:
    """Ranks of the run on this node: the trainer's devices per node, else torchrun's
    ``LOCAL_WORLD_SIZE``, else 1.

    Args:
        trainer: the Lightning ``Trainer`` the datamodule is attached to, if any.
    """
    devices = getattr(trainer, "num_devices", None)
    if isinstance(devices, int) and devices > 0:
        return devices
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def node_readers(trainer: Any, num_workers: int) -> int:
    """Processes of this node that read each train store: local ranks times dataloader workers
    (a rank without workers reads itself).

    Args:
        trainer: the Lightning ``Trainer``, if any.
        num_workers: the train loader's workers per rank.
    """
    return local_ranks(trainer) * max(1, int(num_workers or 0))


def node_root(datamodule: Any, root: StoreRoot) -> StoreRoot:
    """``root`` read by the node's readers of ``datamodule`` (its trainer and ``num_workers``).

    Args:
        datamodule: the ``TextDataModule``.
        root: its store root.
    """
    return root.read_by(node_readers(getattr(datamodule, "trainer", None), getattr(datamodule, "num_workers", 0)))
