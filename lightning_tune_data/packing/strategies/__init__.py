"""Packing strategies, one class per module, registered by name.

Built in, in this order: ``"greedy"`` (next-fit), ``"best_fit"`` (the tightest of at most
``buffer_size`` open packs) and ``"concat"`` (documents back to back, cut at ``max_seq_len``).
:data:`PackingName` is the ``Literal`` of the names registered when this package is first
imported (the datamodule's ``packing`` annotation, so the CLI offers them as choices).
"""

from __future__ import annotations

from typing import Literal

from lightning_tune_data.packing.strategies.base import (
    STRATEGY,
    PackingStrategy,
    get_strategy,
    register_strategy,
    strategy_names,
)
from lightning_tune_data.packing.strategies.greedy import Greedy
from lightning_tune_data.packing.strategies.best_fit import BestFit
from lightning_tune_data.packing.strategies.concat import Concat

#: The names of the registered strategies, as a ``Literal`` type.
PackingName = Literal[strategy_names()]

__all__ = [
    "STRATEGY",
    "BestFit",
    "Concat",
    "Greedy",
    "PackingName",
    "PackingStrategy",
    "get_strategy",
    "register_strategy",
    "strategy_names",
]
