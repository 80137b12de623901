"""lightning_tune_data: exactly-resumable, weighted mixtures of text datasets for Lightning.

Mental model: source -> dataset (stream) -> interleave / pack -> loader -> trainer.
"""

from lightning_tune_data.version import __version__

from lightning_tune_data.collate import PackedCollator, PaddedCollator, expand_batch, shifted_labels
from lightning_tune_data.datamodule.module import TextDataModule
from lightning_tune_data.datamodule.store_tasks import finalize_stores, prepare_task, repair_stores
from lightning_tune_data.models.harness import Harness, MetricSpec
from lightning_tune_data.managers import (
    DatasetManager,
    LocalDatasetManager,
    TokenizedDatasetManager,
    UnconditionalGenerationDatasetManager,
)
from lightning_tune_data.formats import RangedCorpus, TokenCorpus
from lightning_tune_data.metrics import DatasetMetricsCallback, MetricCollector, StandardMetricCollector
from lightning_tune_data.models.source_loss import SourceLossSplit, split_loss_by_source
from lightning_tune_data.models.prediction_writer import PredictionWriter
from lightning_tune_data.sources.arrow import ArrowSource
from lightning_tune_data.sources.memory import InMemoryStream
from lightning_tune_data.sources.base import TuneIterableDataset
from lightning_tune_data.sources.hf_streaming import HFStreamingSource
from lightning_tune_data.mixing.interleave import InterleavedDataset
from lightning_tune_data.mixing.interleave_datasets import interleave_datasets
from lightning_tune_data.mixing.mix_schedule import MixPoint, MixSchedule
from lightning_tune_data.mixing.mixture_plan import MixturePlan
from lightning_tune_data.mixing.online_mixing import MixController, OnlineDataMixing
from lightning_tune_data.mixing.timeline import WeightTimeline
from lightning_tune_data.packing.packer import IterablePackedDataset
from lightning_tune_data.tokenizers import ByteTokenizer, TokenizerFileTokenizer, TransformersTokenizer

__all__ = [
    "finalize_stores",
    "prepare_task",
    "repair_stores",
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
    "MixController",
    "MixPoint",
    "MixSchedule",
    "MixturePlan",
    "OnlineDataMixing",
    "PackedCollator",
    "PaddedCollator",
    "SourceLossSplit",
    "PredictionWriter",
    "StandardMetricCollector",
    "TextDataModule",
    "RangedCorpus",
    "TokenCorpus",
    "TokenizedDatasetManager",
    "TokenizerFileTokenizer",
    "TransformersTokenizer",
    "TuneIterableDataset",
    "UnconditionalGenerationDatasetManager",
    "WeightTimeline",
    "interleave_datasets",
    "expand_batch",
    "shifted_labels",
    "split_loss_by_source",
]
