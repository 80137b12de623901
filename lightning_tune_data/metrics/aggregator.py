"""Turn the provenance side channel of train batches into per-source and whole-stream metrics.

:class:`DatasetMetricsAggregator` keeps, in the main process of each rank, one set of collectors
per train source plus one for the whole stream, and packing counters. ``compute(distributed=True)``
reduces them across DDP ranks with a single ``all_gather_object``: counters are summed,
``epochs_completed`` is the max, and distributions are computed from the union of the ranks'
windows (never by averaging per-rank percentiles). Memory is bounded by (number of sources x window size), whatever the
length of the run.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

import torch
import torch.distributed as dist

from lightning_tune_data.metrics.collector import MetricCollector, StandardMetricCollector
from lightning_tune_data.metrics.window import LENGTH_POLICY_METRICS, LengthPolicyCounts, RecentMix

__all__ = ["DatasetMetricsAggregator", "CollectorsFactory", "PROVENANCE_FIELDS"]

#: A factory building the collector(s) for one dataset name.
CollectorsFactory = Callable[[str], Union[MetricCollector, Sequence[MetricCollector]]]

#: Fields of ``batch["provenance"]`` (one list entry per document piece in the batch).
PROVENANCE_FIELDS = ("source", "epoch", "tokens", "row", "new_document", "truncated_tokens", "dropped_before")

_PACKING_KEYS = ("total_positions", "padding_positions", "packed_rows", "packed_row_docs")

MetricsDict = dict[str, dict[str, dict[str, Any]]]


def _as_list(values: Any) -> list:
    """A provenance column as a plain list (collate may have turned it into a tensor).

    Args:
        values: List, tuple or tensor column.
    """
    if isinstance(values, torch.Tensor):
        return values.tolist()
    return list(values)


def _merge_into(out: MetricsDict, metrics: Mapping[str, Mapping[str, Any]]) -> None:
    """Merge one collector's ``get_metrics()`` output into ``out`` (metrics of the same name are united).

    Args:
        out: Accumulated metrics (modified in place).
        metrics: One collector's ``get_metrics()`` output.
    """
    for name, entry in metrics.items():
        out.setdefault(name, {"metrics": {}})["metrics"].update(dict(entry.get("metrics", {})))


def tidy_weight(weight: float) -> float:
    """A normalised weight as people write it: ``0.1``, not ``0.09999999999999999`` (10 significant digits)."""
    return float(f"{weight:.10g}")


def _is_dist() -> bool:
    """Whether a process group of more than one rank is initialised."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class DatasetMetricsAggregator:
    """Per-source and whole-stream dataset metrics from batch provenance.

    Metrics (seed-000 format ``{name: {"metrics": {...}}}``), for each source name and for
    ``stream_name``: whatever the collectors report (by default :class:`StandardMetricCollector`'s
    ``samples_seen``, ``tokens_seen``, ``epochs_completed``, ``seq_len_*``). Sources also get
    ``share`` (their fraction of the stream's ``samples_seen``, i.e. the realised mixture),
    ``token_share`` (fraction of ``tokens_seen``) and, when known, ``target_weight``. The stream gets
    ``padding_share`` (padding positions / all positions of batches carrying ``attention_mask``) and,
    once a packed batch (one with ``document_ids``) was seen, ``packing_efficiency``
    (``1 - padding_share`` of packed batches) and ``docs_per_pack`` (mean document pieces per row).
    Sources also get ``window_share`` and ``window_token_share``: the same shares over the last
    ``window`` batches only (the mix as it is now). Sources and the stream get ``truncated_docs``,
    ``truncated_tokens`` and ``dropped_docs`` (documents cut or dropped for exceeding ``max_seq_len``,
    from the provenance columns ``truncated_tokens`` and ``dropped_before``).

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
        self._factory = collectors_factory
        self._collectors: dict[str, list[MetricCollector]] = {}
        self._packing = dict.fromkeys(_PACKING_KEYS, 0)
        self._recent = RecentMix(window)
        self._length_policy = LengthPolicyCounts()
        self._warned_unmergeable: set[str] = set()
        self.source_weights: dict[str, float] = {}
        self._collectors_for(stream_name)
        self.set_source_weights(source_weights)

    # ------------------------------------------------------------------ setup
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
            self._collectors_for(name)

    def _build(self, name: str) -> list[MetricCollector]:
        """New collector(s) for ``name`` from the factory, as a list.

        Args:
            name: Source or stream name.
        """
        built = self._factory(name)
        collectors = list(built) if isinstance(built, Sequence) else [built]
        if not collectors:
            raise ValueError(f"DatasetMetricsAggregator: collectors_factory('{name}') returned no collector.")
        return collectors

    def _collectors_for(self, name: str) -> list[MetricCollector]:
        """This rank's collectors for ``name``, created on first use.

        Args:
            name: Source or stream name.
        """
        collectors = self._collectors.get(name)
        if collectors is None:
            collectors = self._collectors[name] = self._build(name)
        return collectors

    @property
    def names(self) -> list[str]:
        """Names with collectors on this rank: the stream first, then sources in order of appearance."""
        return list(self._collectors)

    # ------------------------------------------------------------------ updates
    def update(self, provenance: Mapping[str, Any], batch: Mapping[str, Any] | None = None) -> None:
        """Account for one train batch.

        Args:
            provenance: ``batch["provenance"]``: columns ``source`` and ``tokens`` (required),
                ``epoch`` (default 0), ``new_document`` (default True), ``row``; one entry per document
                piece in the batch.
            batch: The batch itself, for padding and packing statistics (``attention_mask`` and, in
                packed batches, ``document_ids``); optional.
        """
        for field in ("source", "tokens"):
            if field not in provenance:
                raise KeyError(
                    f"DatasetMetricsAggregator.update: provenance has no '{field}' column (got {sorted(provenance)}); "
                    f"expected the columns {PROVENANCE_FIELDS}."
                )
        sources = [str(s) for s in _as_list(provenance["source"])]
        tokens = [int(t) for t in _as_list(provenance["tokens"])]
        n = len(sources)
        epochs = [int(e) for e in _as_list(provenance["epoch"])] if "epoch" in provenance else [0] * n
        new_doc = [bool(f) for f in _as_list(provenance["new_document"])] if "new_document" in provenance else [True] * n
        truncated = [int(t) for t in _as_list(provenance["truncated_tokens"])] if "truncated_tokens" in provenance else [0] * n
        dropped = [int(d) for d in _as_list(provenance["dropped_before"])] if "dropped_before" in provenance else [0] * n
        for field, column in (("tokens", tokens), ("epoch", epochs), ("new_document", new_doc),
                              ("truncated_tokens", truncated), ("dropped_before", dropped)):
            if len(column) != n:
                raise ValueError(
                    f"DatasetMetricsAggregator.update: provenance column '{field}' has {len(column)} entries but "
                    f"'source' has {n}; every column needs one entry per document piece."
                )
        if self.stream_name in sources:
            raise ValueError(
                f"DatasetMetricsAggregator: a source is named '{self.stream_name}', like the stream metrics group; "
                "pass a different stream_name."
            )

        groups: dict[str, list[int]] = {}
        for i, source in enumerate(sources):
            groups.setdefault(source, []).append(i)
        self._feed(self.stream_name, tokens, epochs, new_doc)
        for source, idx in groups.items():
            if len(idx) == n:
                self._feed(source, tokens, epochs, new_doc)
            else:
                self._feed(source, [tokens[i] for i in idx], [epochs[i] for i in idx], [new_doc[i] for i in idx])

        self._recent.add_batch(sources, tokens, new_doc)
        self._length_policy.add(sources, truncated, dropped, new_doc)
        if batch is not None:
            self._update_packing(batch, n)

    def _feed(self, name: str, tokens: list[int], epochs: list[int], new_doc: list[bool]) -> None:
        """Give records (as columns) to the collectors of ``name``; uses ``update_many`` when available.

        Args:
            name: Source or stream name.
            tokens: Tokens per record.
            epochs: Epoch per record.
            new_doc: New-document flag per record.
        """
        for collector in self._collectors_for(name):
            update_many = getattr(collector, "update_many", None)
            if update_many is not None:
                update_many(tokens, epochs, new_doc)
            else:
                for t, e, f in zip(tokens, epochs, new_doc):
                    collector.update_metrics({"source": name, "tokens": t, "epoch": e, "new_document": f})

    def _update_packing(self, batch: Mapping[str, Any], num_records: int) -> None:
        """Count positions, padding and (for packed batches) rows and document pieces.

        Args:
            batch: The batch (``attention_mask`` and/or ``document_ids`` are read).
            num_records: Provenance records (document pieces) in the batch.
        """
        mask = batch.get("attention_mask")
        doc_ids = batch.get("document_ids")
        if isinstance(mask, torch.Tensor):
            self._packing["total_positions"] += mask.numel()
            self._packing["padding_positions"] += int((mask == 0).sum())
        elif isinstance(doc_ids, torch.Tensor):
            self._packing["total_positions"] += doc_ids.numel()
            self._packing["padding_positions"] += int((doc_ids < 0).sum())
        if isinstance(doc_ids, torch.Tensor):
            self._packing["packed_rows"] += doc_ids.shape[0] if doc_ids.dim() > 1 else 1
            self._packing["packed_row_docs"] += num_records

    # ------------------------------------------------------------------ reporting
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
        total_samples = stream.get("samples_seen")
        total_tokens = stream.get("tokens_seen")
        for name, entry in out.items():
            if name == self.stream_name:
                continue
            metrics = entry["metrics"]
            if total_samples is not None and "samples_seen" in metrics:
                metrics["share"] = metrics["samples_seen"] / total_samples if total_samples else 0.0
            if total_tokens is not None and "tokens_seen" in metrics:
                metrics["token_share"] = metrics["tokens_seen"] / total_tokens if total_tokens else 0.0
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
        if packing["total_positions"]:
            stream["padding_share"] = packing["padding_positions"] / packing["total_positions"]
        if packing["packed_rows"]:
            stream["packing_efficiency"] = 1.0 - stream["padding_share"]
            stream["docs_per_pack"] = packing["packed_row_docs"] / packing["packed_rows"]
        return out

    def _ordered(self, names: Sequence[str]) -> list[str]:
        """``names`` with the stream first.

        Args:
            names: Names in order of appearance.
        """
        return [self.stream_name] + [n for n in names if n != self.stream_name]

    def compute(self, distributed: bool = True) -> MetricsDict:
        """Return ``{name: {"metrics": {...}}}`` for the stream and every source.

        With ``distributed=True`` and an initialised process group of more than one rank this is a
        **collective** (one ``all_gather_object``): every rank must call it, and every rank gets the
        same global result. Otherwise the metrics are this process's own.

        Args:
            distributed: Reduce across ranks when a process group is initialised.
        """
        if not (distributed and _is_dist()):
            out: MetricsDict = {}
            for name in self._collectors:
                for collector in self._collectors[name]:
                    _merge_into(out, collector.get_metrics())
            return self._derived(out, self._packing, [self._recent.state_dict()], [self._length_policy.state_dict()])

        payload = {
            "names": list(self._collectors),
            "states": {name: [c.state_dict() for c in cs] for name, cs in self._collectors.items()},
            "packing": dict(self._packing),
            "recent": self._recent.state_dict(),
            "length_policy": self._length_policy.state_dict(),
        }
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, payload)

        names: list[str] = []
        for rank_payload in gathered:
            names.extend(n for n in rank_payload["names"] if n not in names)
        out = {}
        for name in self._ordered(names):
            local = self._collectors.get(name) or self._build(name)  # throwaway if this rank never saw it
            for i, collector in enumerate(local):
                states = [p["states"][name][i] for p in gathered if name in p["states"]]
                merge = getattr(collector, "merge_metrics", None)
                if merge is not None:
                    _merge_into(out, merge(states))
                else:
                    key = f"{name}:{type(collector).__name__}"
                    if key not in self._warned_unmergeable:
                        self._warned_unmergeable.add(key)
                        warnings.warn(
                            f"DatasetMetricsAggregator: collector {type(collector).__name__} for '{name}' has no "
                            "merge_metrics(states); its metrics are this rank's own, not reduced across ranks.",
                            stacklevel=2,
                        )
                    if name in self._collectors:
                        _merge_into(out, collector.get_metrics())
        packing = {k: sum(int(p["packing"][k]) for p in gathered) for k in _PACKING_KEYS}
        return self._derived(out, packing, [p["recent"] for p in gathered], [p["length_policy"] for p in gathered])

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """This rank's state: ``stream_name``, ``collectors`` (name -> states), ``packing``, ``recent``, ``length_policy``."""
        return {
            "stream_name": self.stream_name,
            "collectors": {name: [c.state_dict() for c in cs] for name, cs in self._collectors.items()},
            "packing": dict(self._packing),
            "recent": self._recent.state_dict(),
            "length_policy": self._length_policy.state_dict(),
        }

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a state returned by :meth:`state_dict` (replacing the current counts).

        Args:
            state_dict: What :meth:`state_dict` returned.
        """
        if state_dict.get("stream_name") != self.stream_name:
            raise ValueError(
                f"DatasetMetricsAggregator: the saved metrics are for stream_name={state_dict.get('stream_name')!r} "
                f"but this aggregator has stream_name={self.stream_name!r}."
            )
        collectors: dict[str, list[MetricCollector]] = {}
        for name, states in state_dict["collectors"].items():
            built = self._build(name)
            if len(built) != len(states):
                raise ValueError(
                    f"DatasetMetricsAggregator: the saved metrics for '{name}' have {len(states)} collector states "
                    f"but collectors_factory builds {len(built)}; was the checkpoint written with other collectors?"
                )
            for collector, state in zip(built, states):
                collector.load_state_dict(state)
            collectors[name] = built
        self._collectors = collectors
        self._collectors_for(self.stream_name)
        for name in self.source_weights:
            self._collectors_for(name)
        self._packing = {k: int(state_dict["packing"].get(k, 0)) for k in _PACKING_KEYS}
        self._recent.load_state_dict(state_dict.get("recent", {}))
        self._length_policy.load_state_dict(state_dict.get("length_policy", {}))
