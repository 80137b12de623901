"""The data report: what the configured train stream really delivers, as ``report.md`` plus PNG charts."""

from lightning_tune_data.report.batches import BatchReport, collect, datamodule_from_config
from lightning_tune_data.report.write import write_batch_report, write_metrics_report

__all__ = ["BatchReport", "collect", "datamodule_from_config", "write_batch_report", "write_metrics_report"]
