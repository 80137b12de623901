"""The Lightning side: ``TextDataModule`` wires managers, sources, mixing, packing, loaders and collators."""

from lightning_tune_data.datamodule.module import TextDataModule, default_cache_dir

__all__ = ["TextDataModule", "default_cache_dir"]
