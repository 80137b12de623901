"""The mixture plan: how much of each source a run will draw, how often it repeats, when a cap hits.

:func:`plan_mixture` walks a :class:`~lightning_tune_data.mixing.timeline.WeightTimeline` from the
start of the run to ``max_steps``, turning each quantum's weights into documents and tokens per
source from the sources' sizes (documents, mean tokens per document as the stream hands them
out). A source with a cap (``max_epochs`` passes, ``max_tokens`` tokens) is cut at the position
where its planned draw reaches the cap: from there its weight is 0 and the others share the mix,
on every rank at the same position. The plan is what the run then follows: the cuts are part of
the timeline the mixture draws by.

Counting: without packing a step is ``world_size x batch_size x accumulate_grad_batches``
documents; with packing the same number of full packs (``max_seq_len`` tokens each), so with
packs ``best_fit`` fills to ~99% the schedule's steps run ~1% behind the optimizer's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_tune_data.keys import MixBy
from lightning_tune_data.mixing.timeline import WeightTimeline

__all__ = ["SourceSize", "SourcePlan", "MixturePlan", "plan_mixture", "REPEAT_WARNING_EPOCHS"]

#: A source planned to be read more than this many times (passes) gets a warning at setup: beyond
#: about four passes a repeated token is worth markedly less to a language model than a new one.
REPEAT_WARNING_EPOCHS = 4.0


@dataclass(frozen=True)
class SourceSize:
    """What the plan knows of one source.

    Args:
        documents: documents in one pass (``None``: unknown, e.g. streamed).
        mean_tokens: mean tokens per document as the stream hands them out (``None``: unknown).
        max_epochs: most passes the run may take (``None``: no cap).
        max_tokens: most tokens the run may take (``None``: no cap).
    """

    documents: int | None
    mean_tokens: float | None
    max_epochs: float | None = None
    max_tokens: float | None = None


@dataclass
class SourcePlan:
    """One source's line of the plan (documents and tokens over the whole run, all ranks)."""

    name: str
    documents: float = 0.0
    tokens: float = 0.0
    epochs: float | None = None
    cap_step: float | None = None
    cap: str = ""


@dataclass
class MixturePlan:
    """The plan of a run: per source, what it will draw; the timeline the mixture follows.

    Attributes:
        sources: one :class:`SourcePlan` per source, in order.
        steps: steps planned (``max_steps``; ``None``: unknown, planned to the schedule's last point).
        timeline: the schedule with the caps' cuts.
        exhausted_step: the step at which every source has reached its cap (``None``: never).
    """

    sources: list[SourcePlan]
    steps: float | None
    timeline: WeightTimeline
    exhausted_step: float | None = None
    warnings: list[str] = field(default_factory=list)

    def table(self) -> str:
        """The plan as a text table (what setup prints)."""
        rows = [("source", "tokens", "documents", "epochs", "cap", "cap reached at step")]
        for s in self.sources:
            rows.append((s.name, _count(s.tokens), _count(s.documents),
                         "-" if s.epochs is None else f"{s.epochs:.2f}", s.cap or "-",
                         "-" if s.cap_step is None else f"{s.cap_step:,.0f}"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        steps = "to the schedule's last point" if self.steps is None else f"over {self.steps:,.0f} steps"
        lines = [f"Mixture plan ({steps}):"]
        lines += ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                  for r in rows]
        return "\n".join(lines + [f"  {w}" for w in self.warnings])

    def metrics(self) -> dict[str, float]:
        """The plan's numbers as ``plan/<source>/<field>`` (what setup logs)."""
        out: dict[str, float] = {}
        for s in self.sources:
            out[f"plan/{s.name}/tokens"] = float(s.tokens)
            out[f"plan/{s.name}/documents"] = float(s.documents)
            if s.epochs is not None:
                out[f"plan/{s.name}/epochs"] = float(s.epochs)
            if s.cap_step is not None:
                out[f"plan/{s.name}/cap_step"] = float(s.cap_step)
        return out


def plan_mixture(timeline: WeightTimeline, sizes: Mapping[str, SourceSize], mix_by: MixBy, step_count: MixBy,
                 counts_per_step: float, max_steps: float | None) -> MixturePlan:
    """Plan a run over ``timeline`` (see the module docstring) and cut the capped sources.

    Args:
        timeline: the schedule's weights, without caps.
        sizes: per source name, its size and caps.
        mix_by: what a weight is a share of.
        step_count: what one step counts: ``"documents"`` (no packing) or ``"tokens"`` (packing).
        counts_per_step: documents or tokens of one step of the whole run.
        max_steps: the run's length (``None``: unknown).
    """
    names = timeline.names
    cuts: dict[str, float] = {}
    cap_steps: dict[str, float | None] = {}
    for _ in range(len(names) + 1):
        current = timeline.with_cuts(cuts) if cuts else timeline
        walk = _Walk(current, [sizes[n] for n in names], mix_by, step_count, counts_per_step, max_steps)
        cut = walk.run(set(cuts))
        if cut is None:
            break
        cuts[names[cut[0]]] = cut[1]
        cap_steps[names[cut[0]]] = walk.rows[cut[0]].cap_step
    plan = MixturePlan(walk.rows, max_steps, current, walk.exhausted_step)
    for row, name in zip(plan.sources, names):
        row.cap_step = cap_steps.get(name)
        size = sizes[name]
        row.cap = " / ".join(c for c in (f"{size.max_epochs:g} epochs" if size.max_epochs is not None else "",
                                          f"{_count(size.max_tokens)} tokens" if size.max_tokens is not None else "") if c)
        if row.epochs is not None and row.epochs > REPEAT_WARNING_EPOCHS:
            plan.warnings.append(
                f"Train source '{name}' is planned to be read {row.epochs:.1f} times (more than "
                f"{REPEAT_WARNING_EPOCHS:g} passes): lower its weight, add data, or cap it with max_epochs.")
    return plan


class _Walk:
    """One walk over a timeline's quanta, accumulating each source's planned documents and tokens."""

    def __init__(self, timeline: WeightTimeline, sizes: Sequence[SourceSize], mix_by: MixBy, step_count: MixBy,
                 counts_per_step: float, max_steps: float | None) -> None:
        self.timeline, self.sizes, self.mix_by = timeline, sizes, mix_by
        self.step_count, self.counts_per_step, self.max_steps = step_count, counts_per_step, max_steps
        self.lengths = [s.mean_tokens if s.mean_tokens else 1.0 for s in sizes]
        self.rows = [SourcePlan(n) for n in timeline.names]
        self.exhausted_step: float | None = None

    def _shares(self, weights: Sequence[float]) -> tuple[list[float], float]:
        """Per source its share of documents, and the mean tokens per document of the mix."""
        if self.mix_by == "tokens":
            raw = [w / length for w, length in zip(weights, self.lengths)]
            total = sum(raw)
            docs = [r / total for r in raw] if total > 0 else [0.0] * len(raw)
        else:
            docs = list(weights)
        return docs, sum(d * length for d, length in zip(docs, self.lengths))

    def run(self, already_cut: set[str]) -> tuple[int, float] | None:
        """Walk to the end; returns the first new cut ``(source, position)``, else ``None``."""
        timeline, rows = self.timeline, self.rows
        clock_docs = timeline.count == "documents"
        step, caps = 0.0, [_cap_documents(s) for s in self.sizes]
        for q, start in enumerate(timeline.boundaries):
            weights = timeline.weights(q)
            if not any(weights):
                self.exhausted_step = step
                break
            shares, mean = self._shares(weights)
            docs_per_position = timeline.counts_per_position / (1.0 if clock_docs else mean)
            steps_per_doc = 1.0 / self.counts_per_step * (1.0 if self.step_count == "documents" else mean)
            end = timeline.end_of(q)
            if self.max_steps is not None:  # where the run ends, if within this quantum
                end = min(end, start + (self.max_steps - step) / (docs_per_position * steps_per_doc))
            elif math.isinf(end):
                end = start + _until_caps(rows, shares, caps) / docs_per_position
            span_docs = max(0.0, end - start) * docs_per_position
            cut = _first_cap(rows, shares, caps, span_docs, already_cut, timeline.names)
            if cut is not None:
                index, fraction = cut
                self._add(shares, span_docs * fraction, step, steps_per_doc)
                rows[index].cap_step = step + span_docs * fraction * steps_per_doc
                return index, start + (end - start) * fraction
            step = self._add(shares, span_docs, step, steps_per_doc)
            if self.max_steps is not None and step >= self.max_steps - 1e-9:
                break
        for row, size in zip(rows, self.sizes):
            row.epochs = row.documents / size.documents if size.documents else None
        return None

    def _add(self, shares: Sequence[float], docs: float, step: float, steps_per_doc: float) -> float:
        for row, share, length in zip(self.rows, shares, self.lengths):
            row.documents += share * docs
            row.tokens += share * docs * length
        return step + docs * steps_per_doc


def _cap_documents(size: SourceSize) -> float:
    """A source's cap in documents (``inf``: none)."""
    caps = [math.inf]
    if size.max_epochs is not None and size.documents:
        caps.append(size.max_epochs * size.documents)
    if size.max_tokens is not None and size.mean_tokens:
        caps.append(size.max_tokens / size.mean_tokens)
    return min(caps)


def _first_cap(rows: list[SourcePlan], shares: Sequence[float], caps: Sequence[float], span_docs: float,
               already_cut: set[str], names: Sequence[str]) -> tuple[int, float] | None:
    """The first source whose cap falls within the next ``span_docs`` documents, and how far in."""
    best: tuple[int, float] | None = None
    for i, (row, share, cap) in enumerate(zip(rows, shares, caps)):
        if names[i] in already_cut or share <= 0 or math.isinf(cap):
            continue
        need = (cap - row.documents) / share
        if need <= span_docs and span_docs > 0 and (best is None or need / span_docs < best[1]):
            best = (i, max(0.0, need / span_docs) if span_docs > 0 else 0.0)
    return best


def _until_caps(rows: list[SourcePlan], shares: Sequence[float], caps: Sequence[float]) -> float:
    """Documents until the last capped source in the mix reaches its cap (0: none has a cap)."""
    need = [(cap - row.documents) / share for row, share, cap in zip(rows, shares, caps) if share > 0]
    finite = [n for n in need if math.isfinite(n)]
    return max(finite) if finite else 0.0


def _count(value: Any) -> str:
    """A count the way a table shows it: 1.23B, 45.6M, 7.8k, 912."""
    value = float(value)
    for size, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.0f}"
