"""Human-readable summaries of the data mix: the end-of-fit table and the TensorBoard chart layout."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["format_mix_table", "format_percent", "tensorboard_layout"]


def format_percent(value: Any) -> str:
    """A share as a percentage with one decimal (``0.25`` -> ``"25.0%"``), ``"-"`` when unknown.

    Args:
        value: A fraction, or ``None``.
    """
    return "-" if value is None else f"{100 * float(value):.1f}%"


def format_mix_table(metrics: Mapping[str, Mapping[str, Any]], stream_name: str = "all",
                     mix_by: str = "documents") -> str:
    """A small text table of realised vs target mix per source.

    Args:
        metrics: ``{name: {"metrics": {...}}}`` as :class:`DatasetMetricsAggregator` computes it.
        stream_name: the whole-stream group (left out of the rows).
        mix_by: what the weights are shares of (``"documents"`` or ``"tokens"``); named in the header.

    Returns:
        The table, one line per source, ending without a newline.
    """
    header = ("source", "target", "documents", "tokens", "recent docs", "recent tokens", "truncated", "dropped")
    rows = [header]
    for name, entry in metrics.items():
        if name == stream_name:
            continue
        m = entry.get("metrics", {})
        rows.append((
            name, format_percent(m.get("target_weight")), format_percent(m.get("share")),
            format_percent(m.get("token_share")), format_percent(m.get("window_share")),
            format_percent(m.get("window_token_share")),
            str(int(m.get("truncated_docs", 0))), str(int(m.get("dropped_docs", 0))),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [f"Data mix (weights are shares of {mix_by}; 'recent' = the last window of batches):"]
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(width) if i == 0 else cell.rjust(width)
                               for i, (cell, width) in enumerate(zip(row, widths))))
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    return "\n".join(lines)


def tensorboard_layout(prefix: str = "dataset") -> dict[str, dict[str, list]]:
    """A TensorBoard custom-scalars layout: every source's shares on one chart per metric.

    For ``SummaryWriter.add_custom_scalars``: charts match tags by regular expression, so sources
    added later appear on the same charts.

    Args:
        prefix: First path component of the dataset metrics' tags.
    """
    def chart(metric: str) -> list:
        """One chart with every source's ``metric``."""
        return ["Multiline", [rf"^{prefix}/[^/]+/{metric}$"]]

    return {
        "Data mix": {
            "share of documents": chart("share"),
            "share of tokens": chart("token_share"),
            "recent share of documents": chart("window_share"),
            "recent share of tokens": chart("window_token_share"),
            "target weight": chart("target_weight"),
        },
        "Loss by source": {"train loss": ["Multiline", [r"^train/[^/]+/loss$"]]},
        "Length policy": {
            "truncated documents": chart("truncated_docs"),
            "dropped documents": chart("dropped_docs"),
        },
    }
