"""Packing: documents placed into rows of ``max_seq_len`` tokens, held as references, resumable.

Strategies are classes registered by name (:func:`register_strategy`); :data:`PackingName` is the
``Literal`` of the registered names.
"""

from lightning_tune_data.packing.packer import PACKING_STRATEGIES, IterablePackedDataset
from lightning_tune_data.packing.strategies import (
    PackingName,
    PackingStrategy,
    get_strategy,
    register_strategy,
    strategy_names,
)

__all__ = [
    "PACKING_STRATEGIES",
    "IterablePackedDataset",
    "PackingName",
    "PackingStrategy",
    "get_strategy",
    "register_strategy",
    "strategy_names",
]
