"""Turn the provenance side channel of train batches into per-source and whole-stream metrics.

:class:`DatasetMetricsAggregator` keeps, in the main process of each rank, one set of collectors
per train source plus one for the whole stream (:class:`SourceCollectors`), the packing counters
(:class:`PackingCounts`), the mix of the last batches (:class:`RecentMix`) and the length policy's
counts (:class:`LengthPolicyCounts`); its state nests theirs. ``compute(distributed=True)``
reduces them across DDP ranks with a single ``all_gather_object``: counters are summed,
``epochs_completed`` is the max, and distributions are computed from the union of the ranks'
windows (never by averaging per-rank percentiles). Memory is bounded by (number of sources x window
size), whatever the length of the run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from lightning_tune_data.keys import (
    DROPPED_BEFORE,
    EPOCH,
    NEW_DOCUMENT,
    PROVENANCE_FIELDS,
    SOURCE,
    TARGET_TOKENS,
    TOKENS,
    TRUNCATED_TOKENS,
)
from lightning_tune_data.metrics.collector import (
    SAMPLES_SEEN,
    TOKENS_SEEN,
    CollectorsFactory,
    MetricsDict,
    StandardMetricCollector,
)
from lightning_tune_data.metrics.length_policy import LENGTH_POLICY_METRICS, LengthPolicyCounts
from lightning_tune_data.metrics.packing_counts import PackingCounts
from lightning_tune_data.metrics.recent_mix import RecentMix
from lightning_tune_data.metrics.source_collectors import SourceCollectors

__all__ = [
    "COLLECTORS",
    "CollectorsFactory",
    "DatasetMetricsAggregator",
    "LENGTH_POLICY",
    "PACKING",
    "RECENT",
    "STREAM_NAME",
    "tidy_weight",
]

# Keys of the aggregator's state; each child's state is nested under its key as the child wrote it.
#: The stream's name (a state only loads into an aggregator of the same ``stream_name``).
STREAM_NAME = "stream_name"
#: :meth:`SourceCollectors.state_dict`: ``{name: [state of each collector]}``.
COLLECTORS = "collectors"
#: :meth:`PackingCounts.state_dict`.
PACKING = "packing"
#: :meth:`RecentMix.state_dict`.
RECENT = "recent"
#: :meth:`LengthPolicyCounts.state_dict`.
LENGTH_POLICY = "length_policy"


def _as_list(values: Any) -> list:
    """A provenance column as a plain list (collate may have turned it into a tensor).

    Args:
        values: List, tuple or tensor column.
    """
    if isinstance(values, torch.Tensor):
        return values.tolist()
    return list(values)


def tidy_weight(weight: float) -> float:
    """A normalised weight as people write it: ``0.1``, not ``0.09999999999999999`` (10 significant digits).

    Args:
        weight: The weight.
    """
    return float(f"{weight:.10g}")


def _is_dist() -> bool:
    """Whether a process group of more than one rank is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class DatasetMetricsAggregator:
    """Per-source and whole-stream dataset metrics from batch provenance.

    Metrics (``{name: {"metrics": {...}}}``), for each source name and for ``stream_name``:
    whatever the collectors report (by default :class:`StandardMetricCollector`'s
    ``samples_seen``, ``tokens_seen``, ``epochs_completed``, ``seq_len_*``). Sources also get
    ``share`` (their fraction of the stream's ``samples_seen``, i.e. the realised mixture),
    ``token_share`` (fraction of ``tokens_seen``) and, when known, ``target_weight``. The stream gets
    ``padding_share`` (padding positions / all positions of batches carrying ``attention_mask``) and,
    once a packed batch (one with ``document_ids``) was seen, ``packing_efficiency``
    (``1 - padding_share`` of packed batches) and ``docs_per_pack`` (mean document pieces per row).
    Sources also get ``window_share`` and ``window_token_share``: the same shares over the last
    ``window`` batches only (the mix as it is now). Sources and the stream get ``truncated_docs``,
    ``truncated_tokens`` and ``dropped_docs`` (documents cut or dropped for exceeding ``max_seq_len``,
    from the provenance columns ``truncated_tokens`` and ``dropped_before``), ``no_target_docs``
    (documents with no target label: they add nothing to the loss) and ``target_tokens`` (labels
    trained on), from the provenance column ``target_tokens``.

    Args:
        source_weights: Target weight per source name (normalised here); sources listed are reported
            from the start (with zero counts); sources not listed are added when first seen.
        stream_name: Name of the whole-stream metrics group; must not be a source name.
        collectors_factory: Builds the collector(s) for one name, called as
            ``collectors_factory(name)``; may return one collector or a sequence of them whose
            metrics are merged. Defaults to :class:`StandardMetricCollector`.
        window: Batches the ``window_*`` shares are computed over (per rank; the ranks' windows are
            united, so under DDP it covers the last ``window`` steps of every rank).
    """

    def __init__(
        self,
        source_weights: Mapping[str, float] | None = None,
        stream_name: str = "all",
        collectors_factory: CollectorsFactory = StandardMetricCollector,
        window: int = 100,
    ) -> None:
        if not isinstance(stream_name, str) or not stream_name:
            raise ValueError(f"DatasetMetricsAggregator: stream_name must be a non-empty string, got {stream_name!r}.")
        self.stream_name = stream_name
        self._collectors = SourceCollectors(collectors_factory)
        self._packing = PackingCounts()
        self._recent = RecentMix(window)
        self._length_policy = LengthPolicyCounts()
        self.source_weights: dict[str, float] = {}
        self._collectors.collectors_for(stream_name)
        self.set_source_weights(source_weights)

    def set_source_weights(self, source_weights: Mapping[str, float] | None) -> None:
        """Set (or clear with ``None``) the target weight per source; they are normalised to sum to 1.

        Args:
            source_weights: Source name -> non-negative weight, or ``None``.
        """
        if not source_weights:
            self.source_weights = {}
            return
        if self.stream_name in source_weights:
            raise ValueError(
                f"DatasetMetricsAggregator: source name '{self.stream_name}' collides with stream_name; "
                "pass a different stream_name."
            )
        weights = {str(k): float(v) for k, v in source_weights.items()}
        if any(w < 0 or not math.isfinite(w) for w in weights.values()) or sum(weights.values()) <= 0:
            raise ValueError(
                f"DatasetMetricsAggregator: source_weights must be finite, non-negative and sum to > 0, got {weights}."
            )
        total = sum(weights.values())
        self.source_weights = {k: w / total for k, w in weights.items()}
        for name in self.source_weights:
            self._collectors.collectors_for(name)

    @property
    def names(self) -> list[str]:
        """Names with collectors on this rank: the stream first, then sources in order of appearance."""
        return self._collectors.names

    def update(self, provenance: Mapping[str, Any], batch: Mapping[str, Any] | None = None) -> None:
        """Account for one train batch.

        Args:
            provenance: ``batch["provenance"]``: columns ``source`` and ``tokens`` (required),
                ``epoch`` (default 0), ``new_document`` (default True), ``truncated_tokens`` and
                ``dropped_before`` (default 0), ``target_tokens`` (absent: the target counters do not
                move), ``row``; one entry per document piece in the batch.
            batch: The batch itself, for padding and packing statistics (``attention_mask`` and, in
                packed batches, ``document_ids``); optional.
        """
        for field in (SOURCE, TOKENS):
            if field not in provenance:
                raise KeyError(
                    f"DatasetMetricsAggregator.update: provenance has no '{field}' column (got {sorted(provenance)}); "
                    f"expected the columns {PROVENANCE_FIELDS}."
                )
        sources = [str(s) for s in _as_list(provenance[SOURCE])]
        tokens = [int(t) for t in _as_list(provenance[TOKENS])]
        n = len(sources)
        epochs = [int(e) for e in _as_list(provenance[EPOCH])] if EPOCH in provenance else [0] * n
        new_doc = [bool(f) for f in _as_list(provenance[NEW_DOCUMENT])] if NEW_DOCUMENT in provenance else [True] * n
        truncated = [int(t) for t in _as_list(provenance[TRUNCATED_TOKENS])] if TRUNCATED_TOKENS in provenance else [0] * n
        dropped = [int(d) for d in _as_list(provenance[DROPPED_BEFORE])] if DROPPED_BEFORE in provenance else [0] * n
        targets = [int(t) for t in _as_list(provenance[TARGET_TOKENS])] if TARGET_TOKENS in provenance else None
        for field, column in ((TOKENS, tokens), (EPOCH, epochs), (NEW_DOCUMENT, new_doc),
                              (TRUNCATED_TOKENS, truncated), (DROPPED_BEFORE, dropped), (TARGET_TOKENS, targets or tokens)):
            if len(column) != n:
                raise ValueError(
                    f"DatasetMetricsAggregator.update: provenance column '{field}' has {len(column)} entries but "
                    f"'{SOURCE}' has {n}; every column needs one entry per document piece."
                )
        if self.stream_name in sources:
            raise ValueError(
                f"DatasetMetricsAggregator: a source is named '{self.stream_name}', like the stream metrics group; "
                "pass a different stream_name."
            )

        groups: dict[str, list[int]] = {}
        for i, source in enumerate(sources):
            groups.setdefault(source, []).append(i)
        collectors = self._collectors
        collectors.feed(self.stream_name, tokens, epochs, new_doc)
        for source, idx in groups.items():
            if len(idx) == n:
                collectors.feed(source, tokens, epochs, new_doc)
            else:
                collectors.feed(source, [tokens[i] for i in idx], [epochs[i] for i in idx], [new_doc[i] for i in idx])

        self._recent.add_batch(sources, tokens, new_doc)
        self._length_policy.add(sources, truncated, dropped, new_doc, targets)
        if batch is not None:
            self._packing.add(batch, n)

    def _derived(self, out: MetricsDict, packing: Mapping[str, int], recent: Sequence[Mapping[str, Any]],
                 length_policy: Sequence[Mapping[str, Any]]) -> MetricsDict:
        """Add share / window / length-policy / target weight / packing metrics to merged collector metrics.

        Args:
            out: Merged collector metrics (modified in place and returned).
            packing: Packing counters (this rank's or summed over ranks).
            recent: :class:`RecentMix` states (this rank's, or every rank's).
            length_policy: :class:`LengthPolicyCounts` states (this rank's, or every rank's).
        """
        stream = out.setdefault(self.stream_name, {"metrics": {}})["metrics"]
        total_samples = stream.get(SAMPLES_SEEN)
        total_tokens = stream.get(TOKENS_SEEN)
        for name, entry in out.items():
            if name == self.stream_name:
                continue
            metrics = entry["metrics"]
            if total_samples is not None and SAMPLES_SEEN in metrics:
                metrics["share"] = metrics[SAMPLES_SEEN] / total_samples if total_samples else 0.0
            if total_tokens is not None and TOKENS_SEEN in metrics:
                metrics["token_share"] = metrics[TOKENS_SEEN] / total_tokens if total_tokens else 0.0
            if name in self.source_weights:
                metrics["target_weight"] = tidy_weight(self.source_weights[name])
        window = RecentMix.shares(recent)
        counts = LengthPolicyCounts.merged(length_policy)
        totals = dict.fromkeys(LENGTH_POLICY_METRICS, 0)
        for name, entry in out.items():
            if name == self.stream_name:
                continue
            entry["metrics"].update(window.get(name, {"window_share": 0.0, "window_token_share": 0.0}))
            for metric, value in counts.get(name, dict.fromkeys(LENGTH_POLICY_METRICS, 0)).items():
                entry["metrics"][metric] = value
                totals[metric] += value
        stream.update(totals)
        PackingCounts.add_stream_metrics(packing, stream)
        return out

    def compute(self, distributed: bool = True) -> MetricsDict:
        """Return ``{name: {"metrics": {...}}}`` for the stream and every source.

        With ``distributed=True`` and an initialised process group of more than one rank this is a
        **collective** (one ``all_gather_object``): every rank must call it, and every rank gets the
        same global result. Otherwise the metrics are this process's own.

        Args:
            distributed: Reduce across ranks when a process group is initialised.
        """
        if not (distributed and _is_dist()):
            return self._derived(self._collectors.local_metrics(), self._packing.state_dict(),
                                 [self._recent.state_dict()], [self._length_policy.state_dict()])

        payload = {
            "names": self._collectors.names,
            "states": self._collectors.state_dict(),
            PACKING: self._packing.state_dict(),
            RECENT: self._recent.state_dict(),
            LENGTH_POLICY: self._length_policy.state_dict(),
        }
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, payload)

        names: list[str] = [self.stream_name]
        for rank_payload in gathered:
            names.extend(n for n in rank_payload["names"] if n not in names)
        out = self._collectors.reduced_metrics(names, [p["states"] for p in gathered])
        packing = PackingCounts.summed(p[PACKING] for p in gathered)
        return self._derived(out, packing, [p[RECENT] for p in gathered], [p[LENGTH_POLICY] for p in gathered])

    def state_dict(self) -> dict[str, Any]:
        """This rank's state: ``stream_name``, ``collectors`` (name -> states), ``packing``, ``recent``, ``length_policy``."""
        return {
            STREAM_NAME: self.stream_name,
            COLLECTORS: self._collectors.state_dict(),
            PACKING: self._packing.state_dict(),
            RECENT: self._recent.state_dict(),
            LENGTH_POLICY: self._length_policy.state_dict(),
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a state returned by :meth:`state_dict` (replacing the current counts).

        Args:
            state_dict: What :meth:`state_dict` returned.
        """
        if state_dict.get(STREAM_NAME) != self.stream_name:
            raise ValueError(
                f"DatasetMetricsAggregator: the saved metrics are for stream_name={state_dict.get(STREAM_NAME)!r} "
                f"but this aggregator has stream_name={self.stream_name!r}."
            )
        self._collectors.load_state_dict(state_dict[COLLECTORS])
        self._collectors.collectors_for(self.stream_name)
        for name in self.source_weights:
            self._collectors.collectors_for(name)
        self._packing.load_state_dict(state_dict[PACKING])
        self._recent.load_state_dict(state_dict.get(RECENT, {}))
        self._length_policy.load_state_dict(state_dict.get(LENGTH_POLICY, {}))
