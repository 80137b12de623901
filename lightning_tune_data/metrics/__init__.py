"""Dataset metrics: collectors, the cross-rank aggregator and the Lightning callback that logs them."""

from lightning_tune_data.metrics.aggregator import DatasetMetricsAggregator
from lightning_tune_data.metrics.callback import DatasetMetricsCallback
from lightning_tune_data.metrics.collector import MergeableMetricCollector, MetricCollector, StandardMetricCollector

__all__ = [
    "DatasetMetricsAggregator",
    "DatasetMetricsCallback",
    "MergeableMetricCollector",
    "MetricCollector",
    "StandardMetricCollector",
]
