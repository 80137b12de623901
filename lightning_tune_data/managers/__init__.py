"""Dataset managers: one per source; download -> preprocess -> cache, then load on every rank.

* :class:`DatasetManager`: a Hugging Face hub dataset (``full_name`` or ``path``/``name``/``split``),
  or anything ``datasets.load_dataset`` can load.
* :class:`LocalDatasetManager`: local JSON(L)/CSV/Parquet/text files.
* :class:`TokenizedDatasetManager`: a corpus already tokenized (one of our committed stores, or
  Megatron / datatrove / Dolma / nanoGPT / llm.c / LitData / MDS files), read in place.
* :class:`UnconditionalGenerationDatasetManager`: ``num_examples`` BOS-only prompts for
  unconditional generation (predict); nothing to download or cache.

Lifecycle: ``prepare_data(tokenizer, cache_dir)`` runs once per node (Lightning calls it on local
rank 0) and writes an atomic cache keyed by a fingerprint of everything that changes its content
(see :mod:`lightning_tune_data.cache`); ``setup(tokenizer, cache_dir)`` runs on every rank and
memory-maps that cache (it never builds it). Streaming managers skip the cache and tokenize lazily.

Managers hold only configuration (no open files, no datasets), so they pickle into dataloader
workers. ``source_name`` (the dataloader/metric name, set by the datamodule) is used in messages.
"""

from lightning_tune_data.managers.base import SourceManager
from lightning_tune_data.managers.errors import CacheMissingError, DataSourceError
from lightning_tune_data.managers.hub import DatasetManager, parse_full_name
from lightning_tune_data.managers.local import LOCAL_DS_TYPES, LocalDatasetManager
from lightning_tune_data.managers.options import DEFAULT_PREPROCESS, STAGES, SourceOptions
from lightning_tune_data.managers.preprocess_runner import OUTPUT_COLUMNS
from lightning_tune_data.managers.tokenized import TokenizedDatasetManager
from lightning_tune_data.managers.unconditional import UnconditionalGenerationDatasetManager, UnconditionalPrompts

__all__ = [
    "DEFAULT_PREPROCESS",
    "LOCAL_DS_TYPES",
    "OUTPUT_COLUMNS",
    "STAGES",
    "CacheMissingError",
    "DataSourceError",
    "DatasetManager",
    "LocalDatasetManager",
    "SourceManager",
    "SourceOptions",
    "TokenizedDatasetManager",
    "UnconditionalGenerationDatasetManager",
    "UnconditionalPrompts",
    "parse_full_name",
]
