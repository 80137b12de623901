"""The train mixture over the run: the configured schedule, the sources' caps, and the plan.

:class:`TrainMixture` turns ``TextDataModule(mix_schedule=...)`` and the managers' ``weight``,
``max_epochs`` and ``max_tokens`` into the :class:`~lightning_tune_data.mixing.timeline.WeightTimeline`
the train stream draws by, once ``setup`` knows the sources' sizes and the Trainer's
``max_steps``: it plans the run (:func:`~lightning_tune_data.mixing.mixture_plan.plan_mixture`),
prints and logs the plan, warns about sources repeated too often, and refuses a run whose every
source runs out before ``max_steps``. Without a schedule or a cap it does nothing: the fixed
weights draw as they always did.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from lightning.pytorch.utilities import rank_zero_only, rank_zero_warn

from lightning_tune_data.keys import MixBy
from lightning_tune_data.mixing.mix_schedule import MixSchedule
from lightning_tune_data.mixing.mixture_plan import MixturePlan, SourceSize, plan_mixture
from lightning_tune_data.mixing.timeline import WeightTimeline
from lightning_tune_data.sources.lengths import document_lengths

__all__ = ["TrainMixture", "source_size"]

logger = logging.getLogger(__name__)


def pack_fill(lengths: Mapping[str, np.ndarray], weights: Mapping[str, float], strategy: str, max_seq_len: int,
              buffer_size: int, seed: int = 0, documents: int = 8192) -> float:
    """The share of a pack's ``max_seq_len`` tokens that ``strategy`` fills with documents drawn
    from ``lengths`` in the document shares ``weights``: packed here once, from a seeded sample.

    Args:
        lengths: per source, its documents' token counts as the stream hands them out.
        weights: per source, its share of documents.
        strategy, max_seq_len, buffer_size: the packer's settings.
        seed: seeds the sample (the same on every rank).
        documents: documents packed.
    """
    from lightning_tune_data.packing.packer import IterablePackedDataset
    from lightning_tune_data.sources.memory import InMemoryStream

    rng = np.random.default_rng(seed)
    names = [n for n in lengths if len(lengths[n]) and weights.get(n, 0) > 0]
    if not names:
        return 1.0
    shares = np.asarray([weights[n] for n in names], dtype=float)
    picks = rng.choice(len(names), size=documents, p=shares / shares.sum())
    sample = [np.zeros(int(rng.choice(lengths[names[i]])), dtype=np.int32) for i in picks]
    packer = IterablePackedDataset(InMemoryStream(sample, "fill", shuffle=False, num_passes=1), max_seq_len=max_seq_len,
                                   strategy=strategy, buffer_size=buffer_size)
    packs = [len(p["input_ids"]) for p in packer]
    full = packs[: max(1, len(packs) - buffer_size)]  # the last packs were closed by the sample's end
    return float(sum(full)) / (len(full) * max_seq_len)


def source_size(manager: Any, dataset: Any, max_seq_len: int | None, overlong: str) -> tuple[SourceSize, np.ndarray]:
    """A train source's documents per pass and mean tokens per document, as the stream hands them
    out, and its documents' lengths (empty when unknown).

    Args:
        manager: the source's manager (its ``max_epochs`` / ``max_tokens`` caps).
        dataset: its loaded dataset (``None`` or streamed: size unknown).
        max_seq_len: the sources' length limit (``None``: documents are handed out whole).
        overlong: ``"truncate"`` or ``"drop"`` a longer document.
    """
    caps = {"max_epochs": getattr(manager, "max_epochs", None), "max_tokens": getattr(manager, "max_tokens", None)}
    none = np.zeros(0, dtype=np.int64)
    if dataset is None or getattr(manager, "streaming", False):
        return SourceSize(None, None, **caps), none
    try:
        lengths = np.asarray(document_lengths(dataset), dtype=np.int64)
    except (TypeError, ValueError, AttributeError, KeyError):  # a store without a length column
        try:
            return SourceSize(len(dataset), None, **caps), none
        except TypeError:
            return SourceSize(None, None, **caps), none
    if max_seq_len is not None:
        lengths = lengths[lengths <= max_seq_len] if overlong == "drop" else np.minimum(lengths, max_seq_len)
    lengths = lengths[lengths > 0]
    return SourceSize(int(len(lengths)), float(lengths.mean()) if len(lengths) else None, **caps), lengths


class TrainMixture:
    """The schedule, caps and plan of the train mixture (see the module docstring).

    Args:
        schedule: ``TextDataModule``'s ``mix_schedule`` (``None``: the managers' fixed weights).
        managers: the train managers by name.
        mix_by: what a weight is a share of.
    """

    def __init__(self, schedule: MixSchedule | Mapping[str, Any] | None, managers: Mapping[str, Any],
                 mix_by: MixBy) -> None:
        self.schedule = None if schedule is None else MixSchedule.from_config(schedule)
        self.names = list(managers)
        self.managers = managers
        self.mix_by = mix_by
        if self.schedule is not None:
            self.schedule.resolved(self.names, 1.0)  # names and weights are checked now, positions at setup
        self.plan: MixturePlan | None = None
        self.counts_per_step = 1.0
        self.fill = 1.0
        #: The run's length when no Trainer gives one (a report drawing batches of a fit's config).
        self.run_steps: int | None = None

    @property
    def active(self) -> bool:
        """Whether the run follows a timeline (a schedule or a cap), not fixed weights."""
        return self.schedule is not None or any(
            getattr(m, "max_epochs", None) is not None or getattr(m, "max_tokens", None) is not None
            for m in self.managers.values())

    def fixed(self, weights: dict[str, float]) -> dict[str, float]:
        """``weights`` (the managers') where they are the mix, ``{}`` where a schedule replaces them."""
        return {} if self.schedule is not None else weights

    def describe(self) -> str | None:
        """The schedule and caps as text (what a checkpoint compares; ``None``: fixed weights)."""
        if not self.active:
            return None
        caps = {n: [getattr(m, "max_epochs", None), getattr(m, "max_tokens", None)] for n, m in self.managers.items()}
        return f"{self.schedule.describe() if self.schedule else None} caps={caps}"

    def prepare(self, dataset_of: Callable[[str], Any], *, max_steps: int | None, world_size: int, batch_size: int,
                accumulate: int, packing: str | None, max_seq_len: int, source_max_len: int | None,
                overlong: str, buffer_size: int = 64, seed: int = 0,
                loggers: list[Any] | None = None) -> MixturePlan | None:
        """Plan the run and keep its timeline (nothing when :attr:`active` is false).

        Args:
            dataset_of: the loaded train dataset of a manager, by name.
            max_steps: the Trainer's ``max_steps`` (``None``: unknown; fractions of the run are then refused).
            world_size, batch_size, accumulate: ranks, rows per batch, batches per optimizer step.
            packing: the packing strategy (``None``: one document per row).
            max_seq_len: tokens per row.
            source_max_len: the sources' length limit (``None`` when the packer splits documents).
            overlong: ``"truncate"`` or ``"drop"``.
            buffer_size, seed: the packer's open packs, and the seed of the sample that measures its fill.
            loggers: the Trainer's loggers, which get the plan's numbers.

        Raises:
            ValueError: a fraction of the run without ``max_steps``; every source reaches its cap
                before ``max_steps``.
        """
        if not self.active:
            return None
        measured = {n: source_size(m, dataset_of(n), source_max_len, overlong) for n, m in self.managers.items()}
        sizes = {n: size for n, (size, _) in measured.items()}
        for name, size in sizes.items():
            if (size.max_epochs is not None and not size.documents) or (size.max_tokens is not None and not size.mean_tokens):
                raise ValueError(f"TextDataModule.dataset_managers.train.{name}: its size is unknown here (a streamed "
                                 "source), so its max_epochs / max_tokens cap cannot be planned; remove the cap or "
                                 "cache the source.")
        step_count: MixBy = "documents" if packing is None else "tokens"
        schedule = self.schedule or MixSchedule.from_config(
            {"points": [{"at": 0, "weights": {n: float(m.weight) for n, m in self.managers.items()}}]})
        self.fill = 1.0
        if packing is not None:  # a step is a batch of packs as full as the packer fills them
            first = dict(zip(self.names, schedule.resolved(self.names, 1.0)[0][1]))
            if self.mix_by == "tokens":
                first = {n: w / (sizes[n].mean_tokens or 1.0) for n, w in first.items()}
            self.fill = pack_fill({n: lengths for n, (_, lengths) in measured.items()}, first, packing, max_seq_len,
                                  buffer_size, seed)
        self.counts_per_step = float(world_size * batch_size * accumulate) * (1 if packing is None else max_seq_len * self.fill)
        if schedule.unit == "steps":
            count, per_position, run_length = step_count, self.counts_per_step, max_steps
        else:
            count, per_position = "tokens", 1.0
            run_length = None if max_steps is None or packing is None else max_steps * self.counts_per_step
            if schedule.uses_fractions() and packing is None:
                raise ValueError("TextDataModule.mix_schedule: points at a fraction of the run with unit 'tokens' "
                                 "need packing (a step's tokens are then known); give `at` as token counts, or use "
                                 "unit: steps.")
        points = schedule.resolved(self.names, run_length)
        timeline = WeightTimeline.from_points(self.names, points, schedule.interpolation, count, per_position,
                                              description=self.describe() or "")
        self.plan = plan = plan_mixture(timeline, sizes, self.mix_by, step_count, self.counts_per_step, max_steps)
        if plan.exhausted_step is not None and (max_steps is None or plan.exhausted_step < max_steps):
            raise ValueError(
                f"TextDataModule: every train source reaches its cap (max_epochs / max_tokens) by step "
                f"{plan.exhausted_step:,.0f}, before max_steps={max_steps}. Raise a cap, add a source without one, "
                f"or set max_steps <= {int(plan.exhausted_step)}.\n{plan.table()}")
        if rank_zero_only.rank == 0:
            print(plan.table(), flush=True)
        for warning in plan.warnings:
            rank_zero_warn(warning)
        for lg in loggers or []:
            log_metrics = getattr(lg, "log_metrics", None)
            if log_metrics is not None:
                log_metrics(plan.metrics(), step=0)
        return plan

    @property
    def timeline(self) -> WeightTimeline | None:
        """The timeline the train stream draws by (``None``: fixed weights, or not planned yet)."""
        return None if self.plan is None else self.plan.timeline

    def targets_at(self, step: float) -> dict[str, float] | None:
        """The schedule's weights at optimizer step ``step`` (``None``: fixed weights)."""
        timeline = self.timeline
        if timeline is None:
            return None
        if self.schedule is not None and self.schedule.unit == "tokens":
            return timeline.weights_at(step * self._tokens_per_step())
        return timeline.weights_at(step)

    def _tokens_per_step(self) -> float:
        plan = self.plan
        if plan is None or not plan.steps:
            return self.counts_per_step
        return sum(s.tokens for s in plan.sources) / plan.steps

    def prepare_for(self, datamodule: Any, trainer: Any, stage: str | None = None) -> MixturePlan | None:
        """:meth:`prepare` with a ``TextDataModule``'s settings and its Trainer's, when ``stage``
        trains a stream whose datasets are set up.

        Args:
            datamodule: the ``TextDataModule``.
            trainer: its Trainer (``max_steps``, world size, gradient accumulation, loggers), or ``None``.
            stage: the stage ``setup`` prepares (``"fit"`` or ``None`` plan the mixture).
        """
        from lightning_tune_data.datamodule.train_stream import packing_splits_documents

        if stage not in ("fit", None) or datamodule.train_mode != "stream" or not datamodule._datasets["train"]:
            return None
        max_steps = getattr(trainer, "max_steps", None)
        max_steps = max_steps if max_steps and max_steps > 0 else self.run_steps
        return self.prepare(
            lambda name: datamodule._datasets["train"].get(name), max_steps=max_steps if max_steps and max_steps > 0 else None,
            world_size=int(getattr(trainer, "world_size", 1) or 1), batch_size=datamodule.batch_size,
            accumulate=int(getattr(trainer, "accumulate_grad_batches", 1) or 1), packing=datamodule.packing,
            max_seq_len=datamodule.max_seq_len,
            source_max_len=None if packing_splits_documents(datamodule.packing) else datamodule.max_seq_len,
            overlong=datamodule.overlong, buffer_size=datamodule.packing_buffer_size, seed=datamodule.seed,
            loggers=list(getattr(trainer, "loggers", None) or []))

    def timeline_for(self, datamodule: Any) -> WeightTimeline | None:
        """The timeline to draw by, planned now without a Trainer if ``setup`` has not (``None``: fixed weights).

        Args:
            datamodule: the ``TextDataModule`` whose train datasets are set up.
        """
        if self.active and self.plan is None:
            self.prepare_for(datamodule, None)
        return self.timeline
