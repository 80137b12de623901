"""``lightning-tune-data report``: a picture of the training data before (or after) training.

    lightning-tune-data report --config configs/quickstart.yaml --batches 50 --output runs/quickstart/report
    lightning-tune-data report --metrics runs/quickstart/logs/version_0/metrics.csv --output runs/quickstart/report

With ``--config`` it draws ``--batches`` batches from the configured train stream (no model, no
training; caches are prepared like ``fit`` would) and writes ``report.md`` with charts of the
realised vs target mix, document lengths, padding/packing efficiency, truncation and a preview of
the first rows. With ``--metrics`` it writes the same kind of report from a finished run's
``metrics.csv`` (CSVLogger with ``DatasetMetricsCallback``).
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    """The command's argument parser."""
    parser = argparse.ArgumentParser(
        prog="lightning-tune-data report",
        description="Write a data report (report.md + PNG charts) from a fit config or from a run's metrics.csv.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", help="a `lightning-tune-data fit` YAML config (its data: section is used)")
    source.add_argument("--metrics", help="metrics.csv written by a CSVLogger during a fit")
    parser.add_argument("--batches", type=int, default=50, help="train batches to draw with --config (default 50)")
    parser.add_argument("--output", required=True, help="directory for report.md and the PNG charts")
    parser.add_argument("--cache-dir", default=None, help="override data.cache_dir of the config")
    parser.add_argument("--preview-rows", type=int, default=3, help="rows of the first batch to preview, plus a row for each source they do not show (default 3)")
    return parser


def main(argv: list[str]) -> int:
    """Parse ``argv``, write the report and print where it is; returns the exit code.

    Args:
        argv: The command's arguments (without the program and command names).

    Returns:
        0 once the report is written, 2 when the config, the metrics file or the data is unusable
        (the problem is printed to stderr).
    """
    args = _parser().parse_args(argv)
    from lightning_tune_data.report.write import write_batch_report, write_metrics_report

    try:
        if args.metrics:
            path = write_metrics_report(args.metrics, args.output)
        else:
            from lightning_tune_data.report.batches import collect, datamodule_from_config

            datamodule = datamodule_from_config(args.config, cache_dir=args.cache_dir)
            report = collect(datamodule, args.batches, preview_rows=args.preview_rows)
            path = write_batch_report(report, datamodule.tokenizer, args.output, config=args.config)
    except (OSError, ValueError, argparse.ArgumentError) as error:
        print(f"lightning-tune-data report: {error}", file=sys.stderr)
        return 2
    print(f"Wrote {path}")
    return 0
