"""Per-dataset metric collectors: the ``MetricCollector`` protocol and ``StandardMetricCollector``.

A collector consumes *provenance records*, one per document piece the model trained on::

    {"source": str, "epoch": int, "tokens": int, "new_document": bool}

and reports ``get_metrics() -> {dataset_name: {"metrics": {metric: number}}}``.
Collectors live in the **main process** and are fed by :class:`~.aggregator.DatasetMetricsAggregator`
from the provenance side channel of each batch, so they are exact for any
``num_workers``.

Collectors are per rank. To be reduced across DDP ranks correctly a collector implements the
optional :class:`MergeableMetricCollector` method ``merge_metrics(states)``, which receives every
rank's ``state_dict()`` and returns the global metrics (counters summed, distributions computed
from the union of the ranks' windows: never averaged or summed percentiles).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, Union, runtime_checkable

import numpy as np

from lightning_tune_data.keys import EPOCH, NEW_DOCUMENT, TOKENS

__all__ = [
    "EPOCHS_COMPLETED",
    "SAMPLES_SEEN",
    "SEQ_LENS",
    "TOKENS_SEEN",
    "CollectorsFactory",
    "MergeableMetricCollector",
    "MetricCollector",
    "MetricsDict",
    "STANDARD_STATE_KEYS",
    "StandardMetricCollector",
]

#: Metrics as collectors report them: ``{dataset_name: {"metrics": {metric_name: value}}}``.
MetricsDict = dict[str, dict[str, dict[str, Any]]]

# State keys of :class:`StandardMetricCollector`; the first three are also the names of its counters' metrics.
#: Documents started.
SAMPLES_SEEN = "samples_seen"
#: Tokens of every record.
TOKENS_SEEN = "tokens_seen"
#: Passes completed by the furthest-ahead shard.
EPOCHS_COMPLETED = "epochs_completed"
#: The window of recent sequence lengths (a state key only).
SEQ_LENS = "seq_lens"
#: Every key of a :class:`StandardMetricCollector` state.
STANDARD_STATE_KEYS = frozenset((SAMPLES_SEEN, TOKENS_SEEN, EPOCHS_COMPLETED, SEQ_LENS))


@runtime_checkable
class MetricCollector(Protocol):
    """What a metric collector implements.

    ``state_dict()`` must return plain containers (ints, floats, strings, lists, dicts) or tensors so
    that checkpoints load with ``torch.load(weights_only=True)``, and must be bounded in size
    regardless of how long training runs.
    """

    def update_metrics(self, sample: dict[str, Any]) -> None:
        """Account for one provenance record.

        Args:
            sample: ``{"source": str, "epoch": int, "tokens": int, "new_document": bool}``.
        """

    def get_metrics(self) -> dict[str, dict[str, dict[str, float | int]]]:
        """Return ``{dataset_name: {"metrics": {metric_name: value}}}``."""

    def increment_epoch(self) -> None:
        """Record that one more pass over the dataset has completed."""

    def state_dict(self) -> dict[str, Any]:
        """Return the collector's state (plain containers, bounded size)."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a state returned by :meth:`state_dict`.

        Args:
            state_dict: What :meth:`state_dict` returned.
        """


@runtime_checkable
class MergeableMetricCollector(MetricCollector, Protocol):
    """A collector whose metrics can be reduced exactly across DDP ranks."""

    def merge_metrics(self, states: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, float | int]]]:
        """Return global metrics (same format as ``get_metrics``) from every rank's ``state_dict()``.

        Args:
            states: The ``state_dict()`` of this collector on each rank that has one.
        """


#: A factory building the collector(s) for one dataset name.
CollectorsFactory = Callable[[str], Union[MetricCollector, Sequence[MetricCollector]]]


def _seq_len_stats(window: Sequence[int]) -> dict[str, float]:
    """Mean, median and 95th percentile (linear interpolation) of a window of lengths.

    Args:
        window: Sequence lengths; must be non-empty.
    """
    arr = np.asarray(window, dtype=np.float64)
    p50, p95 = np.percentile(arr, [50.0, 95.0])
    return {"seq_len_mean": float(arr.mean()), "seq_len_p50": float(p50), "seq_len_p95": float(p95)}


class StandardMetricCollector:
    """Counters plus a bounded sliding window of sequence lengths for one dataset.

    Metrics reported by :meth:`get_metrics`:

    * ``samples_seen``: documents started (records with ``new_document=True``). A packed document
      continuing from a previous block is not counted again.
    * ``tokens_seen``: real (non-padding) tokens of every record, continuations included.
    * ``epochs_completed``: passes over the source completed by the furthest-ahead shard, i.e. the
      highest ``epoch`` index seen in any record (a record from pass ``e`` means passes
      ``0 .. e-1`` were completed by the shard that produced it). :meth:`increment_epoch` adds
      one for sources that don't report epochs.
    * ``seq_len_mean``, ``seq_len_p50``, ``seq_len_p95``: statistics of the token counts of the
      last ``seq_len_stat_window_size`` records (the lengths of the document pieces as the model
      saw them); absent while the window is empty. Percentiles use linear interpolation, so
      ``seq_len_p50`` is the median of the window.
    * ``seq_len_window_size``: number of lengths the statistics are computed from.

    Args:
        dataset_name: Name the metrics are reported under.
        seq_len_stat_window_size: Maximum number of recent lengths kept (memory bound).
    """

    def __init__(self, dataset_name: str, seq_len_stat_window_size: int = 1000) -> None:
        if not isinstance(dataset_name, str) or not dataset_name:
            raise ValueError(f"StandardMetricCollector: dataset_name must be a non-empty string, got {dataset_name!r}.")
        if int(seq_len_stat_window_size) < 1:
            raise ValueError(
                f"StandardMetricCollector('{dataset_name}'): seq_len_stat_window_size must be >= 1, "
                f"got {seq_len_stat_window_size}."
            )
        self.dataset_name = dataset_name
        self.seq_len_stat_window_size = int(seq_len_stat_window_size)
        self.samples_seen = 0
        self.tokens_seen = 0
        self.epochs_completed = 0
        self._seq_lens: deque[int] = deque(maxlen=self.seq_len_stat_window_size)

    # ------------------------------------------------------------------ updates
    def update_metrics(self, sample: dict[str, Any]) -> None:
        """Account for one provenance record.

        Args:
            sample: ``{"tokens": int, "epoch": int (default 0), "new_document": bool (default True)}``;
                other keys (``source``, ``row``) are ignored.
        """
        tokens = int(sample[TOKENS])
        if sample.get(NEW_DOCUMENT, True):
            self.samples_seen += 1
        self.tokens_seen += tokens
        epoch = int(sample.get(EPOCH, 0))
        if epoch > self.epochs_completed:
            self.epochs_completed = epoch
        self._seq_lens.append(tokens)

    def update_many(self, tokens: Sequence[int], epochs: Iterable[int], new_document: Iterable[bool]) -> None:
        """Account for many records at once (same result as calling :meth:`update_metrics` per record).

        Args:
            tokens: Token count of each record.
            epochs: Epoch index of each record.
            new_document: Whether each record starts a new document.
        """
        tokens = [int(t) for t in tokens]
        self.tokens_seen += sum(tokens)
        self.samples_seen += sum(1 for flag in new_document if flag)
        max_epoch = max((int(e) for e in epochs), default=0)
        if max_epoch > self.epochs_completed:
            self.epochs_completed = max_epoch
        self._seq_lens.extend(tokens)

    def increment_epoch(self) -> None:
        """Record one more completed pass (for sources whose records don't carry ``epoch``)."""
        self.epochs_completed += 1

    # ------------------------------------------------------------------ reporting
    @property
    def seq_len_window(self) -> list[int]:
        """The current window of sequence lengths, oldest first (a copy)."""
        return list(self._seq_lens)

    def _metrics_from(self, samples: int, tokens: int, epochs: int, window: Sequence[int]) -> dict[str, dict]:
        """Metrics ``{dataset_name: {"metrics": {...}}}`` from counters and a window.

        Args:
            samples: Documents started.
            tokens: Tokens seen.
            epochs: Epochs completed.
            window: Sequence lengths the statistics are computed from.
        """
        metrics: dict[str, float | int] = {
            SAMPLES_SEEN: samples,
            TOKENS_SEEN: tokens,
            EPOCHS_COMPLETED: epochs,
            "seq_len_window_size": len(window),
        }
        if len(window):
            metrics.update(_seq_len_stats(window))
        return {self.dataset_name: {"metrics": metrics}}

    def get_metrics(self) -> dict[str, dict[str, dict[str, float | int]]]:
        """Return ``{dataset_name: {"metrics": {...}}}`` for this process only."""
        return self._metrics_from(self.samples_seen, self.tokens_seen, self.epochs_completed, self._seq_lens)

    def merge_metrics(self, states: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, float | int]]]:
        """Global metrics from several ranks' states: counters summed, epochs max, stats on the union.

        Args:
            states: ``state_dict()`` of this collector on each rank.
        """
        window: list[int] = []
        for state in states:
            window.extend(int(x) for x in state[SEQ_LENS])
        return self._metrics_from(
            sum(int(s[SAMPLES_SEEN]) for s in states),
            sum(int(s[TOKENS_SEEN]) for s in states),
            max((int(s[EPOCHS_COMPLETED]) for s in states), default=0),
            window,
        )

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Return ``{"samples_seen", "tokens_seen", "epochs_completed", "seq_lens"}`` (plain ints/lists)."""
        return {
            SAMPLES_SEEN: self.samples_seen,
            TOKENS_SEEN: self.tokens_seen,
            EPOCHS_COMPLETED: self.epochs_completed,
            SEQ_LENS: list(self._seq_lens),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore counters and window (a window longer than this collector's keeps its newest lengths).

        Args:
            state_dict: What :meth:`state_dict` returned.
        """
        missing = STANDARD_STATE_KEYS - set(state_dict)
        if missing:
            raise KeyError(
                f"StandardMetricCollector('{self.dataset_name}'): state is missing {sorted(missing)}; "
                "was it written by a different collector class?"
            )
        self.samples_seen = int(state_dict[SAMPLES_SEEN])
        self.tokens_seen = int(state_dict[TOKENS_SEEN])
        self.epochs_completed = int(state_dict[EPOCHS_COMPLETED])
        self._seq_lens = deque((int(x) for x in state_dict[SEQ_LENS]), maxlen=self.seq_len_stat_window_size)

    def __repr__(self) -> str:
        return (
            f"StandardMetricCollector({self.dataset_name!r}, samples_seen={self.samples_seen}, "
            f"tokens_seen={self.tokens_seen}, window={len(self._seq_lens)}/{self.seq_len_stat_window_size})"
        )
