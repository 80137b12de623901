"""Draw batches from a configured train stream and summarise what they hold (no model, no training).

:func:`datamodule_from_config` builds the ``TextDataModule`` of a ``lightning-tune-data fit``
config from its ``data:`` section, parsed the way the LightningCLI parses it. :func:`collect`
draws batches from its train loader and returns a :class:`BatchReport`: the realised mix after
every batch, per-batch padding, the final dataset metrics (the same numbers
``DatasetMetricsCallback`` logs), document lengths from the cache, and a few rows to preview.
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
    return parser.instantiate_classes(parsed).data


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
        preview: the first rows of the first batch (``input_ids``, ``labels``, ``document_ids`` lists)
            and their provenance.
        notes: what explains the numbers (the end-of-fit table's notes): documents drawn with no
            target token, and documents held in open packs.
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

    @property
    def batches(self) -> int:
        """Number of batches drawn."""
        return len(self.real_fraction)


def _preview(batch: Mapping[str, Any], rows: int) -> dict[str, Any]:
    """The first ``rows`` rows of ``batch`` as lists, with the provenance of their documents."""
    out: dict[str, Any] = {key: batch[key][:rows].tolist() for key in PREVIEW_KEYS if key in batch}
    provenance = batch[PROVENANCE]
    keep = [i for i, row in enumerate(provenance.get(ROW, range(len(provenance[SOURCE])))) if row < rows]
    out[PROVENANCE] = {key: [list(values)[i] for i in keep] for key, values in provenance.items()}
    return out


def collect(datamodule: TextDataModule, batches: int, preview_rows: int = 3) -> BatchReport:
    """Prepare, set up and draw ``batches`` train batches from ``datamodule``.

    Args:
        datamodule: the configured datamodule (nothing has to be prepared yet).
        batches: how many batches to draw (``>= 1``).
        preview_rows: rows of the first batch kept for the preview.
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
            if index == 0:
                report.preview = _preview(batch, preview_rows)
    finally:
        del iterator  # stops the loader's workers
    report.metrics = aggregator.compute(distributed=False)
    report.notes = mix_notes(report.metrics, aggregator.stream_name, datamodule, world_size=1)
    return report
