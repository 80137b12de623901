"""Write the data report: ``report.md`` plus PNG charts, from drawn batches or from a run's ``metrics.csv``."""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning_tune_data.cache.cache_counters import CACHE_METRICS
from lightning_tune_data.cache.sizes import human_size
from lightning_tune_data.metrics.summary import format_percent, no_target_notes
from lightning_tune_data.report.batches import BatchReport
from lightning_tune_data.report.plots import (
    plot_efficiency, plot_lengths, plot_losses, plot_mix, plot_online_mixing, plot_schedule, plot_truncation,
)
from lightning_tune_data.report.preview import LEGEND, render_rows
from lightning_tune_data.tokenizers import Tokenizer

__all__ = ["read_metrics_csv", "write_batch_report", "write_metrics_report"]


def _mix_table(sources: list[str], metrics: Mapping[str, Any], extra: Mapping[str, Mapping[str, str]]) -> list[str]:
    """Markdown table rows: per source its target weight, realised shares and the ``extra`` columns."""
    columns = ["source", "target weight", "documents", "tokens", *next(iter(extra.values()), {}).keys()]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for source in sources:
        m = metrics.get(source, {})
        cells = [f"`{source}`", format_percent(m.get("target_weight")), format_percent(m.get("share")),
                 format_percent(m.get("token_share")),
                 *extra.get(source, {}).values()]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _notes(notes: list[str]) -> list[str]:
    """Markdown lines of the notes that explain the mix table (none: no lines)."""
    return [line for note in notes for line in (f"> **Note:** {note}", "")]


def write_batch_report(report: BatchReport, tokenizer: Tokenizer, output: str | Path, config: str = "") -> Path:
    """Write ``output/report.md`` and its charts for batches drawn with :func:`~.batches.collect`.

    Args:
        report: What the drawn batches held.
        tokenizer: Decodes the preview rows.
        output: Directory for ``report.md`` and the PNG charts (created).
        config: The config the batches were drawn from, named in the report.

    Returns:
        The path of ``report.md``.
    """
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    metrics = {name: entry["metrics"] for name, entry in report.metrics.items()}
    stream = metrics.get("all", {})
    x = list(range(1, report.batches + 1))
    plot_mix(out / "mix.png", x, report.doc_shares, report.token_shares, report.targets, report.mix_by)
    plot_lengths(out / "lengths.png", report.lengths, report.max_seq_len)
    kind = f"packing={report.packing}" if report.packing else "padded rows (no packing)"
    plot_efficiency(out / "efficiency.png", x, report.real_fraction, f"Real tokens per position, {kind}")
    overlong = {s: float((v > report.max_seq_len).mean()) if len(v) else 0.0 for s, v in report.lengths.items()}
    drawn = {s: max(metrics.get(s, {}).get("samples_seen", 0), 1) for s in report.sources}
    truncated = {s: metrics.get(s, {}).get("truncated_docs", 0) / drawn[s] for s in report.sources}
    dropped = {s: metrics.get(s, {}).get("dropped_docs", 0) / drawn[s] for s in report.sources}
    plot_truncation(out / "truncation.png", report.sources, overlong, truncated, dropped)

    extra = {
        s: {"documents drawn": f"{metrics.get(s, {}).get('samples_seen', 0):,}",
            "tokens drawn": f"{metrics.get(s, {}).get('tokens_seen', 0):,}",
            "longer than max_seq_len (cache)": format_percent(overlong[s]) if len(report.lengths[s]) else "-",
            "truncated / dropped (drawn)": f"{metrics.get(s, {}).get('truncated_docs', 0)} / "
                                           f"{metrics.get(s, {}).get('dropped_docs', 0)}",
            "no target (drawn)": f"{metrics.get(s, {}).get('no_target_docs', 0):,}"}
        for s in report.sources
    }
    lines = [
        "# Data report", "",
        f"{report.batches} train batches drawn{f' from `{config}`' if config else ''} (no model, no training): "
        f"batch_size={report.batch_size}, max_seq_len={report.max_seq_len}, "
        f"packing={report.packing or 'none'}; weights are shares of **{report.mix_by}**.", "",
        "## Mix: realised vs target", "",
        *_mix_table(report.sources, metrics, extra), "",
        *_notes(report.notes),
        "![realised vs target mix](mix.png)", "",
        "Solid lines: share of documents; dashed: share of tokens; dotted: the target weight.", "",
        *(["## Mixture plan", "", "```text", report.plan, "```", ""] if report.plan else []),
        "## Document lengths", "", "![document lengths](lengths.png)", "",
        "## Padding and packing", "",
        f"- real tokens / positions: {format_percent(1 - stream.get('padding_share', 0.0))}",
        f"- documents per row: {stream.get('docs_per_pack', 1.0):.2f}" if report.packing else "- one document per row",
        "", "![efficiency](efficiency.png)", "",
        "## Truncation", "", "![truncation](truncation.png)", "",
        "## Preview of rows", "",
        "The first rows of the first batch, and for every source they do not show, the first row that holds it.",
        "", LEGEND, "",
    ]
    for block in render_rows(report.preview, tokenizer, origins=report.preview_origin):
        lines += ["```text", block, "```", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _schedule_section(rows: list[dict[str, float]], keys: set[str], sources: list[str], out: Path) -> list[str]:
    """The report's mixture schedule: the plan logged at setup, and target vs realised share per
    source over the run (none without ``mix/<source>/target`` columns)."""
    lines: list[str] = []
    planned = [s for s in sources if f"plan/{s}/tokens" in keys]
    if planned:
        first = {k: v for row in rows for k, v in row.items() if k.startswith("plan/")}
        lines += ["## Mixture plan", "", "| source | planned tokens | planned documents | epochs | cap reached at step |",
                  "|---|---|---|---|---|"]
        for s in planned:
            epochs, cap = first.get(f"plan/{s}/epochs"), first.get(f"plan/{s}/cap_step")
            lines.append(f"| `{s}` | {first[f'plan/{s}/tokens']:,.0f} | {first[f'plan/{s}/documents']:,.0f} | "
                         f"{'-' if epochs is None else f'{epochs:.2f}'} | {'-' if cap is None else f'{cap:,.0f}'} |")
        lines.append("")
    scheduled = [s for s in sources if f"mix/{s}/target" in keys]
    if scheduled:
        target_steps, _ = _series(rows, f"mix/{scheduled[0]}/target")
        steps, _ = _series(rows, f"dataset/{scheduled[0]}/window_share")
        plot_schedule(out / "schedule.png", steps, {s: _series(rows, f"dataset/{s}/window_share")[1] for s in scheduled},
                      target_steps, {s: _series(rows, f"mix/{s}/target")[1] for s in scheduled})
        lines += ["## Mixture schedule: target vs realised", "", "![mixture schedule](schedule.png)", "",
                  "Dotted: the schedule's target weight at each logged step; solid: the share of documents over "
                  "the recent window of batches.", ""]
    return lines


def _online_section(rows: list[dict[str, float]], keys: set[str], sources: list[str], out: Path) -> list[str]:
    """The report's online mixing: per source the controller's weight and the loss it saw at each
    update (none without ``mix/<source>/weight`` columns)."""
    controlled = [s for s in sources if f"mix/{s}/weight" in keys]
    if not controlled:
        return []
    steps, _ = _series(rows, f"mix/{controlled[0]}/weight")
    plot_online_mixing(out / "online_mixing.png", steps, {s: _series(rows, f"mix/{s}/weight")[1] for s in controlled},
                       {s: _series(rows, f"mix/{s}/loss")[1] for s in controlled})
    return ["## Online mixing", "", "![online mixing](online_mixing.png)", "",
            "Top: the controller's weight of each source at each update; bottom: the source's mean loss per target "
            "token over the interval before it.", ""]


def read_metrics_csv(path: str | Path) -> list[dict[str, float]]:
    """Rows of a CSVLogger ``metrics.csv`` with their non-empty numeric cells, in file order.

    Args:
        path: The ``metrics.csv`` file.
    """
    rows = []
    with Path(path).open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            values = {}
            for key, value in row.items():
                try:
                    values[key] = float(value)
                except (TypeError, ValueError):
                    continue
            rows.append(values)
    return rows


def _series(rows: list[dict[str, float]], key: str) -> tuple[list[float], list[float]]:
    """Steps and values of the rows that logged ``key``."""
    points = [(row["step"], row[key]) for row in rows if key in row and "step" in row]
    return [p[0] for p in points], [p[1] for p in points]


def _cache_section(last: Mapping[str, float], keys: set[str]) -> list[str]:
    """A table of what the node caches did for each store read shard by shard (the last logged
    ``cache/<source>/<metric>`` values); nothing when no store was."""
    stores = sorted({key.split("/")[1] for key in keys if key.startswith("cache/") and key.count("/") == 2})
    if not stores:
        return []
    lines = ["## Node shard cache", "", "| source | downloaded | hits | misses | evictions | waited | over budget |",
             "|---|---|---|---|---|---|---|"]
    for store in stores:
        value = {metric: last.get(f"cache/{store}/{metric}", 0.0) for metric in CACHE_METRICS}
        lines.append(f"| {store} | {human_size(int(value['downloaded_bytes']))} | {int(value['hits']):,} | "
                     f"{int(value['misses']):,} | {int(value['evictions']):,} | {value['wait_s']:.1f} s | "
                     f"{int(value['over_budget']):,} |")
    return [*lines, "", "Shards a reader found on the node (hits) or waited for (misses), and the time it waited.", ""]


def write_metrics_report(metrics_csv: str | Path, output: str | Path) -> Path:
    """Write ``output/report.md`` and charts from a finished run's logged ``metrics.csv``.

    Args:
        metrics_csv: The run's ``metrics.csv`` (CSVLogger with ``DatasetMetricsCallback``).
        output: Directory for ``report.md`` and the PNG charts (created).

    Returns:
        The path of ``report.md``.

    Raises:
        ValueError: the file holds no ``dataset/<source>/share`` column (no ``DatasetMetricsCallback``).
    """
    rows = read_metrics_csv(metrics_csv)
    keys = {key for row in rows for key in row}
    sources = sorted({k.split("/")[1] for k in keys if k.startswith("dataset/") and k.endswith("/share")})
    if not sources:
        raise ValueError(
            f"{metrics_csv}: no dataset/<source>/share column; log the run with DatasetMetricsCallback "
            "(trainer.callbacks) and a CSVLogger."
        )
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    last: dict[str, float] = {}
    for row in rows:
        last.update(row)
    metrics = {s: {m: last[f"dataset/{s}/{m}"] for m in ("share", "token_share", "target_weight", "window_share",
                                                         "window_token_share", "truncated_docs", "dropped_docs",
                                                         "no_target_docs", "samples_seen") if f"dataset/{s}/{m}" in last}
               for s in sources}
    steps, _ = _series(rows, f"dataset/{sources[0]}/share")
    plot_mix(out / "mix.png", steps, {s: _series(rows, f"dataset/{s}/share")[1] for s in sources},
             {s: _series(rows, f"dataset/{s}/token_share")[1] for s in sources},
             {s: m["target_weight"] for s, m in metrics.items() if "target_weight" in m}, None,
             xlabel="step")
    lines = ["# Data report", "", f"From the logged metrics of `{metrics_csv}` (last logged step "
             f"{int(steps[-1]) if steps else 0}).", "", "## Mix: realised vs target", ""]
    extra = {s: {"recent documents": format_percent(m.get("window_share")),
                 "recent tokens": format_percent(m.get("window_token_share")),
                 "truncated / dropped": f"{int(m.get('truncated_docs', 0))} / {int(m.get('dropped_docs', 0))}",
                 "no target": f"{int(m.get('no_target_docs', 0)):,}"}
             for s, m in metrics.items()}
    notes = no_target_notes({s: {"metrics": m} for s, m in metrics.items()}, stream_name="all")
    lines += [*_mix_table(sources, metrics, extra), "", *_notes(notes), "![realised vs target mix](mix.png)", "",
              "Solid lines: share of documents; dashed: share of tokens; dotted: the target weight.", ""]
    lines += _schedule_section(rows, keys, sources, out)
    lines += _online_section(rows, keys, sources, out)
    losses = {k.split("/")[1]: k for k in sorted(keys) if k.startswith("train/") and k.endswith("/loss")}
    if losses:
        series = {name: _series(rows, key) for name, key in losses.items()}
        plot_losses(out / "loss.png", {n: s[0] for n, s in series.items()}, {n: s[1] for n, s in series.items()},
                    sources)
        lines += ["## Train loss by source", "", "![train loss by source](loss.png)", ""]
    if "dataset/all/padding_share" in keys:
        x, padding = _series(rows, "dataset/all/padding_share")
        plot_efficiency(out / "efficiency.png", x, [1 - p for p in padding],
                        "Real tokens per position (cumulative)", xlabel="step")
        lines += ["## Padding and packing", "", "![efficiency](efficiency.png)", ""]
    drawn = {s: max(m.get("samples_seen", 0), 1) for s, m in metrics.items()}
    plot_truncation(out / "truncation.png", sources, None,
                    {s: m.get("truncated_docs", 0) / drawn[s] for s, m in metrics.items()},
                    {s: m.get("dropped_docs", 0) / drawn[s] for s, m in metrics.items()})
    lines += ["## Truncation", "", "![truncation](truncation.png)", ""]
    lines += _cache_section(last, keys)
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
