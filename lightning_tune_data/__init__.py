"""lightning_tune_data: exactly-resumable, weighted mixtures of text datasets for Lightning.

Mental model: source -> dataset (stream) -> interleave / pack -> loader -> trainer.
"""

__version__ = "0.2.0"

from .collate import PackedCollator, PaddedCollator, shifted_labels
from .datamodule import TextDataModule
from .harness import Harness, MetricSpec
from .managers import DatasetManager, LocalDatasetManager, UnconditionalGenerationDatasetManager
from .metrics import DatasetMetricsCallback, MetricCollector, StandardMetricCollector
from .source_loss import SourceLossSplit, split_loss_by_source
from .prediction_writer import PredictionWriter
from .streams.arrow_source import ArrowSource
from .streams.memory import InMemoryStream
from .streams.base import TuneIterableDataset
from .streams.hf_streaming import HFStreamingSource
from .streams.interleave import InterleavedDataset, interleave_datasets
from .streams.packing import IterablePackedDataset
from .tokenizers import ByteTokenizer, TokenizerFileTokenizer, TransformersTokenizer

__all__ = [
    "ArrowSource",
    "ByteTokenizer",
    "DatasetManager",
    "DatasetMetricsCallback",
    "HFStreamingSource",
    "Harness",
    "InMemoryStream",
    "InterleavedDataset",
    "IterablePackedDataset",
    "LocalDatasetManager",
    "MetricCollector",
    "MetricSpec",
    "PackedCollator",
    "PaddedCollator",
    "SourceLossSplit",
    "PredictionWriter",
    "StandardMetricCollector",
    "TextDataModule",
    "TokenizerFileTokenizer",
    "TransformersTokenizer",
    "TuneIterableDataset",
    "UnconditionalGenerationDatasetManager",
    "interleave_datasets",
    "shifted_labels",
    "split_loss_by_source",
]
