"""Mixing: weighted interleaving of several sources into one stream, by documents or by tokens."""

from lightning_tune_data.mixing.interleave import InterleavedDataset
from lightning_tune_data.mixing.interleave_datasets import interleave_datasets
from lightning_tune_data.mixing.mix_schedule import MixPoint, MixSchedule
from lightning_tune_data.mixing.online_mixing import MixController, OnlineDataMixing
from lightning_tune_data.mixing.timeline import WeightTimeline

__all__ = ["InterleavedDataset", "MixController", "MixPoint", "MixSchedule", "OnlineDataMixing", "WeightTimeline",
           "interleave_datasets"]
