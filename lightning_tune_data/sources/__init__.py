"""Sources: readers of one source each (cached Arrow rows, Hugging Face streaming, in-memory lists).

Every source is an infinite, sharded, resumable ``TuneIterableDataset`` whose pass order is a pure
function of the seed and the pass number.
"""

from lightning_tune_data.sources.arrow import ArrowSource
from lightning_tune_data.sources.base import TuneIterableDataset
from lightning_tune_data.sources.hf_streaming import HFStreamingSource
from lightning_tune_data.sources.memory import InMemoryStream

__all__ = ["ArrowSource", "HFStreamingSource", "InMemoryStream", "TuneIterableDataset"]
