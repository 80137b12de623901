"""Train-side streams: sources -> interleave -> pack, each infinite, sharded and resumable."""

from .arrow_source import ArrowSource
from .base import TuneIterableDataset
from .hf_streaming import HFStreamingSource
from .interleave import InterleavedDataset, interleave_datasets
from .memory import InMemoryStream
from .packing import IterablePackedDataset

__all__ = [
    "ArrowSource",
    "HFStreamingSource",
    "InMemoryStream",
    "InterleavedDataset",
    "IterablePackedDataset",
    "TuneIterableDataset",
    "interleave_datasets",
]
