"""Packing: documents placed into rows of ``max_seq_len`` tokens, held as references, resumable."""

from lightning_tune_data.packing.packer import IterablePackedDataset

__all__ = ["IterablePackedDataset"]
