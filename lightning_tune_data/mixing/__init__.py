"""Mixing: weighted interleaving of several sources into one stream, by documents or by tokens."""

from lightning_tune_data.mixing.interleave import InterleavedDataset
from lightning_tune_data.mixing.interleave_datasets import interleave_datasets

__all__ = ["InterleavedDataset", "interleave_datasets"]
