"""This rank's metric collectors of every dataset name: the whole stream and each train source.

:class:`SourceCollectors` builds the collector(s) of a name with the user's factory the first time
the name is seen, feeds them provenance columns, and reports their metrics: this rank's own, or
reduced over every rank's states with each collector's ``merge_metrics``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from lightning_tune_data.keys import EPOCH, NEW_DOCUMENT, SOURCE, TOKENS
from lightning_tune_data.metrics.collector import CollectorsFactory, MetricCollector, MetricsDict

__all__ = ["SourceCollectors"]


def _merge_into(out: MetricsDict, metrics: Mapping[str, Mapping[str, Any]]) -> None:
    """Merge one collector's ``get_metrics()`` output into ``out`` (metrics of the same name are united).

    Args:
        out: Accumulated metrics (modified in place).
        metrics: One collector's ``get_metrics()`` output.
    """
    for name, entry in metrics.items():
        out.setdefault(name, {"metrics": {}})["metrics"].update(dict(entry.get("metrics", {})))


class SourceCollectors:
    """The collectors of every name on this rank, in order of appearance.

    Args:
        factory: Builds the collector(s) for one name, called as ``factory(name)``; may return one
            collector or a sequence of them whose metrics are merged.
    """

    def __init__(self, factory: CollectorsFactory) -> None:
        self.factory = factory
        self.by_name: dict[str, list[MetricCollector]] = {}
        self._warned_unmergeable: set[str] = set()

    def build(self, name: str) -> list[MetricCollector]:
        """New collector(s) for ``name`` from the factory, as a list (not kept).

        Args:
            name: Source or stream name.
        """
        built = self.factory(name)
        collectors = list(built) if isinstance(built, Sequence) else [built]
        if not collectors:
            raise ValueError(f"DatasetMetricsAggregator: collectors_factory('{name}') returned no collector.")
        return collectors

    def collectors_for(self, name: str) -> list[MetricCollector]:
        """This rank's collectors for ``name``, created on first use.

        Args:
            name: Source or stream name.
        """
        collectors = self.by_name.get(name)
        if collectors is None:
            collectors = self.by_name[name] = self.build(name)
        return collectors

    @property
    def names(self) -> list[str]:
        """Names with collectors on this rank, in order of appearance."""
        return list(self.by_name)

    def feed(self, name: str, tokens: list[int], epochs: list[int], new_doc: list[bool]) -> None:
        """Give records (as columns) to the collectors of ``name``; uses ``update_many`` when available.

        Args:
            name: Source or stream name.
            tokens: Tokens per record.
            epochs: Epoch per record.
            new_doc: New-document flag per record.
        """
        for collector in self.collectors_for(name):
            update_many = getattr(collector, "update_many", None)
            if update_many is not None:
                update_many(tokens, epochs, new_doc)
            else:
                for t, e, f in zip(tokens, epochs, new_doc):
                    collector.update_metrics({SOURCE: name, TOKENS: t, EPOCH: e, NEW_DOCUMENT: f})

    def local_metrics(self) -> MetricsDict:
        """Every collector's metrics on this rank, merged per name."""
        out: MetricsDict = {}
        for name in self.by_name:
            for collector in self.by_name[name]:
                _merge_into(out, collector.get_metrics())
        return out

    def reduced_metrics(self, names: Sequence[str], rank_states: Sequence[Mapping[str, Sequence[Any]]]) -> MetricsDict:
        """Metrics reduced over every rank with each collector's ``merge_metrics(states)``.

        A collector without ``merge_metrics`` reports this rank's own metrics, with a warning (once
        per name and collector class).

        Args:
            names: Every name any rank has, in the order they are reported.
            rank_states: Each rank's :meth:`state_dict`.
        """
        out: MetricsDict = {}
        for name in names:
            local = self.by_name.get(name) or self.build(name)  # throwaway if this rank never saw it
            for i, collector in enumerate(local):
                states = [rank[name][i] for rank in rank_states if name in rank]
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
                            stacklevel=3,
                        )
                    if name in self.by_name:
                        _merge_into(out, collector.get_metrics())
        return out

    def state_dict(self) -> dict[str, list[Any]]:
        """``{name: [state of each collector]}``, in order of appearance."""
        return {name: [c.state_dict() for c in cs] for name, cs in self.by_name.items()}

    def load_state_dict(self, state_dict: Mapping[str, Sequence[Any]]) -> None:
        """Replace every collector with new ones restored from a :meth:`state_dict`.

        Args:
            state_dict: What :meth:`state_dict` returned.

        Raises:
            ValueError: the factory builds another number of collectors than a name has states.
        """
        by_name: dict[str, list[MetricCollector]] = {}
        for name, states in state_dict.items():
            built = self.build(name)
            if len(built) != len(states):
                raise ValueError(
                    f"DatasetMetricsAggregator: the saved metrics for '{name}' have {len(states)} collector states "
                    f"but collectors_factory builds {len(built)}; was the checkpoint written with other collectors?"
                )
            for collector, state in zip(built, states):
                collector.load_state_dict(state)
            by_name[name] = built
        self.by_name = by_name
