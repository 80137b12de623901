"""Draw batches from a configured train stream and summarise what they hold (no model, no training).

:func:`datamodule_from_config` builds the ``TextDataModule`` of a ``lightning-tune-data fit``
config from its ``data:`` section, parsed the way the LightningCLI parses it. :func:`collect`
draws batches from its train loader and returns a :class:`BatchReport`: the realised mix after
every batch, per-batch padding, the final dataset metrics (the same numbers
``DatasetMetricsCallback`` logs), document lengths from the cache, and rows to preview: the first
rows of the first batch, plus the first row that holds each source those rows miss.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from lightning_tune_data.datamodule.module import TextDataModule
from lightning_tune_data.keys import (
    ATTENTION_MASK,
    DOCUMENT_IDS,
    INPUT_IDS,
    LABELS,
    NEW_DOCUMENT,
    PROVENANCE,
    ROW,
    SOURCE,
    TOKENS,
)
from lightning_tune_data.metrics.aggregator import DatasetMetricsAggregator
from lightning_tune_data.metrics.summary import mix_notes
from lightning_tune_data.sources.lengths import document_lengths

__all__ = ["BatchReport", "PREVIEW_KEYS", "collect", "datamodule_from_config"]

#: Batch tensors kept (their first rows) for the preview.
PREVIEW_KEYS = (INPUT_IDS, LABELS, DOCUMENT_IDS, ATTENTION_MASK)


def datamodule_from_config(config: str | Path | Mapping[str, Any], cache_dir: str | None = None) -> TextDataModule:
    """The ``TextDataModule`` a fit with ``config`` would use (only its ``data:`` section is read).

    Args:
        config: a ``lightning-tune-data fit`` YAML config (path), or such a config as a mapping.
        cache_dir: overrides ``data.cache_dir``.

    Raises:
        ValueError: the config has no ``data:`` section.
    """
    from lightning.pytorch.cli import LightningArgumentParser

    loaded = config if isinstance(config, Mapping) else yaml.safe_load(Path(config).read_text(encoding="utf-8"))
    data = (loaded or {}).get("data")
    if not isinstance(data, Mapping):
        raise ValueError(f"{config}: no 'data:' section; the report reads the datamodule configured under data:.")
    data = dict(data)
    if cache_dir is not None:
        data["cache_dir"] = str(cache_dir)
    parser = LightningArgumentParser(exit_on_error=False)
    parser.add_lightning_class_args(TextDataModule, "data", subclass_mode=False)
    parsed = parser.parse_object({"data": data})
    datamodule = parser.instantiate_classes(parsed).data
    max_steps = ((loaded or {}).get("trainer") or {}).get("max_steps")
    if isinstance(max_steps, int) and max_steps > 0:  # a mixture schedule's fractions are of this run
        datamodule.mixture.run_steps = max_steps
    return datamodule


@dataclass
class BatchReport:
    """What a number of drawn train batches held.

    Attributes:
        sources: train source names, in config order.
        targets: normalised target weight per source.
        mix_by: what the weights are shares of (``"documents"`` or ``"tokens"``).
        max_seq_len, packing, batch_size: the datamodule's settings.
        doc_shares, token_shares: per source, the cumulative realised share after each batch.
        real_fraction: per batch, real tokens / positions (1 - padding share).
        metrics: the final dataset metrics, ``{name: {"metrics": {...}}}``.
        lengths: per source, every cached document's length (empty for streaming sources).
        preview: rows to preview (``input_ids``, ``labels``, ``document_ids`` lists) and the
            provenance of their documents: the first rows of the first batch, then, for each source
            they do not show, the first drawn row that holds it.
        preview_origin: ``(batch, row)`` of each previewed row.
        notes: what explains the numbers (the end-of-fit table's notes): documents drawn with no
            target token, and documents held in open packs.
        plan: the mixture plan's table, when the datamodule has a schedule or caps (else ``""``).
    """

    sources: list[str]
    targets: dict[str, float]
    mix_by: str
    max_seq_len: int
    packing: str | None
    batch_size: int
    doc_shares: dict[str, list[float]] = field(default_factory=dict)
    token_shares: dict[str, list[float]] = field(default_factory=dict)
    real_fraction: list[float] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    lengths: dict[str, np.ndarray] = field(default_factory=dict)
    preview: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    preview_origin: list[tuple[int, int]] = field(default_factory=list)
    plan: str = ""

    @property
    def batches(self) -> int:
        """Number of batches drawn."""
        return len(self.real_fraction)


def _rows_of_entries(provenance: Mapping[str, Any]) -> list[int]:
    """The batch row of each provenance entry (one document, or piece, per entry)."""
    return [int(row) for row in provenance.get(ROW, range(len(provenance[SOURCE])))]


def _pick_rows(batch: Mapping[str, Any], first: int, missing: set[str]) -> list[int]:
    """Rows of ``batch`` to preview: its first ``first`` rows, then the first row of each source in
    ``missing`` that those rows do not show (``missing`` loses every source the picked rows show)."""
    provenance = batch[PROVENANCE]
    sources_in_row: dict[int, set[str]] = {}
    for row, source in zip(_rows_of_entries(provenance), provenance[SOURCE]):
        sources_in_row.setdefault(row, set()).add(str(source))
    picked = list(range(min(first, len(batch[INPUT_IDS]))))
    for row in picked:
        missing -= sources_in_row.get(row, set())
    for row in sorted(sources_in_row):
        if missing & sources_in_row[row] and row not in picked:
            picked.append(row)
            missing -= sources_in_row[row]
    return picked


def _add_preview(preview: dict[str, Any], batch: Mapping[str, Any], rows: list[int]) -> None:
    """Append rows ``rows`` of ``batch`` to ``preview`` (as lists), with the provenance of their documents."""
    start = len(preview.get(INPUT_IDS, []))
    for key in PREVIEW_KEYS:
        if key in batch:
            preview.setdefault(key, []).extend(batch[key][row].tolist() for row in rows)
    provenance = {key: list(values) for key, values in batch[PROVENANCE].items()}
    entry_rows = _rows_of_entries(provenance)
    position = {row: start + i for i, row in enumerate(rows)}
    keep = sorted((position[row], i) for i, row in enumerate(entry_rows) if row in position)
    shown = preview.setdefault(PROVENANCE, {key: [] for key in provenance})
    for key, values in provenance.items():
        shown.setdefault(key, []).extend(position[entry_rows[i]] if key == ROW else values[i] for _, i in keep)


def collect(datamodule: TextDataModule, batches: int, preview_rows: int = 3) -> BatchReport:
    """Prepare, set up and draw ``batches`` train batches from ``datamodule``.

    Args:
        datamodule: the configured datamodule (nothing has to be prepared yet).
        batches: how many batches to draw (``>= 1``).
        preview_rows: rows of the first batch kept for the preview; a source they do not show
            adds the first drawn row that holds it.
    """
    if batches < 1:
        raise ValueError(f"report: --batches must be >= 1, got {batches}.")
    datamodule.prepare_data()
    datamodule.setup("fit")
    targets = dict(datamodule.train_source_weights)
    sources = list(targets)
    report = BatchReport(sources, targets, getattr(datamodule, "mix_by", "documents"), datamodule.max_seq_len,
                         datamodule.packing, datamodule.batch_size)
    for name in sources:
        try:
            report.lengths[name] = document_lengths(datamodule.dataset("train", name))
        except ValueError:  # a streaming source: no cached lengths
            report.lengths[name] = np.zeros(0, dtype=np.int64)
    aggregator = DatasetMetricsAggregator(targets, window=batches)
    docs = dict.fromkeys(sources, 0)
    tokens = dict.fromkeys(sources, 0)
    report.doc_shares = {name: [] for name in sources}
    report.token_shares = {name: [] for name in sources}
    unseen = set(sources)  # sources no previewed row shows yet
    iterator = iter(datamodule.train_dataloader())
    try:
        for index in range(batches):
            try:
                batch = next(iterator)
            except StopIteration:
                break
            provenance = batch[PROVENANCE]
            aggregator.update(provenance, batch)
            for source, n, new in zip(provenance[SOURCE], provenance[TOKENS], provenance[NEW_DOCUMENT]):
                docs[source] = docs.get(source, 0) + int(bool(new))
                tokens[source] = tokens.get(source, 0) + int(n)
            total_docs, total_tokens = max(sum(docs.values()), 1), max(sum(tokens.values()), 1)
            for name in sources:
                report.doc_shares[name].append(docs[name] / total_docs)
                report.token_shares[name].append(tokens[name] / total_tokens)
            mask = batch[ATTENTION_MASK]
            report.real_fraction.append(float(mask.sum()) / mask.numel())
            if index == 0 or unseen:
                rows = _pick_rows(batch, preview_rows if index == 0 else 0, unseen)
                _add_preview(report.preview, batch, rows)
                report.preview_origin.extend((index, row) for row in rows)
    finally:
        del iterator  # stops the loader's workers
    report.metrics = aggregator.compute(distributed=False)
    report.notes = mix_notes(report.metrics, aggregator.stream_name, datamodule, world_size=1)
    plan = getattr(getattr(datamodule, "mixture", None), "plan", None)
    report.plan = plan.table() if plan is not None else ""
    return report
