"""The main-process side of online mixing: ``TextDataModule(mix_controller=..., mix_update_every=N)``.

:class:`MixControl` sums each train source's loss, target tokens and documents over the steps of
an interval (fed by :meth:`MixControl.observe` from the model's per-source loss split), and at
every ``N``-th optimizer step reduces them over the ranks (one all-reduce through the strategy),
asks the controller for new weights, publishes them to the loader's workers
(:class:`~lightning_tune_data.mixing.weight_versions.WeightVersions`) and logs
``mix/<source>/weight`` and ``mix/<source>/loss``. The weights of the update at step ``s`` apply
from position ``s + delay`` (:func:`weights_delay`), identically on every rank and worker.

Its state (the controller's, the published weights, the interval's sums of every rank) is part of
the datamodule's data state, so a resumed run publishes the same weights at the same steps.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_warn

from lightning_tune_data.datamodule.train_mixture import source_size
from lightning_tune_data.distributed import current_rank_and_world_size
from lightning_tune_data.keys import NEW_DOCUMENT, PROVENANCE, SOURCE
from lightning_tune_data.mixing.online_mixing import MixController
from lightning_tune_data.mixing.online_timeline import ONLINE_BLOCK_DOCUMENTS, OnlineTimeline
from lightning_tune_data.mixing.timeline import WeightTimeline
from lightning_tune_data.mixing.weight_versions import WeightVersions
from lightning_tune_data.packing.progress import read_ahead_documents

__all__ = ["MixControl", "MIX_CONTROL_KEY", "build_controller", "load_mix_state", "train_timeline", "weights_delay",
           "with_mix_state"]

#: Key of the online mixing state in the datamodule's data state.
MIX_CONTROL_KEY = "mix_control"
#: Versions a table holds when the run's length is unknown.
_DEFAULT_CAPACITY = 1 << 16


def build_controller(value: Any) -> Any:
    """A controller from an object, a class path, or ``{"class_path": ..., "init_args": {...}}``.

    Args:
        value: the ``mix_controller`` setting.
    """
    if isinstance(value, str):
        value = {"class_path": value}
    if isinstance(value, Mapping):
        path = value.get("class_path")
        if not isinstance(path, str) or "." not in path:
            raise ValueError(f"TextDataModule.mix_controller: {dict(value)!r}; give class_path: package.module.Class "
                             "(and init_args), or a controller object.")
        module, _, name = path.rpartition(".")
        value = getattr(importlib.import_module(module), name)(**dict(value.get("init_args") or {}))
    for method in ("update", "state_dict", "load_state_dict"):
        if not callable(getattr(value, method, None)):
            raise ValueError(f"TextDataModule.mix_controller: {type(value).__name__} has no {method}(); a controller "
                             "needs update(step, stats), state_dict() and load_state_dict() (see MixController).")
    return value


def weights_delay(num_workers: int, prefetch_factor: int | None, accumulate: int, read_ahead_steps: float = 0.0) -> int:
    """Optimizer steps between an update and the position its weights apply from.

    The loader runs ahead of training by the batches in flight (``num_workers x prefetch_factor``
    requested, Lightning's one batch fetched ahead, the one in training) plus one batch per worker
    in the making; the packer's read-ahead adds ``read_ahead_steps``. The delay is one step more
    than all of that, so no worker needs weights before the main process has published them.

    Args:
        num_workers, prefetch_factor: the train loader's.
        accumulate: batches per optimizer step.
        read_ahead_steps: how far (in steps) the packer reads the mixture ahead of its packs.
    """
    batches = 2 + num_workers * ((prefetch_factor or 0) + 1)
    return int(math.floor(batches / max(1, accumulate) + read_ahead_steps)) + 1


class MixControl:
    """A controller, its interval's sums and the published weights (see the module docstring).

    Args:
        controller: the controller (an object, or a class path with init args).
        every: optimizer steps between two updates.
        names: the train sources, in order.
    """

    def __init__(self, controller: Any, every: int, names: list[str]) -> None:
        if int(every) < 1:
            raise ValueError(f"TextDataModule.mix_update_every: {every}; give a number of optimizer steps >= 1.")
        self.controller = build_controller(controller)
        self.every = int(every)
        self.names = list(names)
        self.history: list[tuple[int, list[float]]] = []  # (update step, weights) of versions 1, 2, ...
        self.last_update = 0
        self.delay = 0
        self.started = False
        self.versions: WeightVersions | None = None
        self.weight_source: OnlineTimeline | None = None
        self._sums: torch.Tensor | None = None  # [2, K] loss sums and target tokens, float64
        self._documents = [0.0] * len(self.names)
        self._index = {name: i for i, name in enumerate(self.names)}
        self._saved: dict[str, Any] | None = None

    @classmethod
    def configured(cls, controller: Any, every: int, names: list[str]) -> MixControl | None:
        """The control of a datamodule (``None`` without a controller: nothing runs)."""
        return None if controller is None else cls(controller, every, names)

    # -- the interval's sums ------------------------------------------------------------------
    def observe(self, split: Any, batch: Mapping[str, Any]) -> None:
        """Add one train batch's per-source loss sums and target tokens (this rank's), and its documents.

        Args:
            split: the batch's :class:`~lightning_tune_data.models.source_loss.SourceLossSplit`
                (before any all-reduce), its sources in the datamodule's train order.
            batch: the batch (its provenance's ``source`` and ``new_document`` columns).
        """
        if list(split.sources) != self.names:
            raise ValueError(f"Online mixing: the loss split names {split.sources}, the train sources are "
                             f"{self.names}; split the loss with sources=datamodule.train_source_weights' names.")
        stacked = torch.stack([split.loss_sum.detach(), split.tokens.detach()]).to(torch.float64)
        self._sums = stacked if self._sums is None else self._sums.to(stacked.device) + stacked
        provenance = batch.get(PROVENANCE) or {}
        news = provenance.get(NEW_DOCUMENT)
        for j, source in enumerate(provenance.get(SOURCE, ())):
            if news is None or bool(news[j]):
                self._documents[self._index[str(source)]] += 1

    def _reduced(self, trainer: Any) -> list[list[float]]:
        """The interval's sums over every rank: ``[loss sums, tokens, documents]``, each per source."""
        device = getattr(getattr(trainer, "strategy", None), "root_device", torch.device("cpu"))
        sums = self._sums.to(device) if self._sums is not None else torch.zeros(2, len(self.names), dtype=torch.float64,
                                                                                 device=device)
        stacked = torch.cat([sums, torch.tensor([self._documents], dtype=torch.float64, device=device)])
        if getattr(trainer, "world_size", 1) > 1:
            stacked = trainer.strategy.reduce(stacked, reduce_op="sum")
        return stacked.cpu().tolist()

    # -- updates ------------------------------------------------------------------------------
    def maybe_update(self, trainer: Any) -> None:
        """At the first batch after every ``every``-th optimizer step: update, publish and log (every rank)."""
        step = int(trainer.global_step)
        if step == 0 or step % self.every or step <= self.last_update or self.versions is None:
            return
        loss, tokens, documents = self._reduced(trainer)
        stats = {name: {"tokens": tokens[i], "documents": documents[i],
                        **({"loss": loss[i] / tokens[i]} if tokens[i] > 0 else {})}
                 for i, name in enumerate(self.names)}
        weights = self._checked(self.controller.update(step, stats))
        self.history.append((step, weights))
        self.versions.publish(weights)
        self.last_update = step
        self._sums, self._documents = None, [0.0] * len(self.names)
        if getattr(trainer, "is_global_zero", True):
            metrics = {f"mix/{n}/weight": w for n, w in zip(self.names, weights)}
            metrics.update({f"mix/{n}/loss": s["loss"] for n, s in stats.items() if "loss" in s})
            for logger in getattr(trainer, "loggers", None) or []:
                logger.log_metrics(metrics, step=step - 1)

    def _checked(self, weights: Any) -> list[float]:
        what = f"TextDataModule.mix_controller ({type(self.controller).__name__}).update"
        if not isinstance(weights, Mapping) or set(weights) != set(self.names):
            raise ValueError(f"{what} returned {weights!r}; return a weight for each train source {self.names}.")
        values = [float(weights[n]) for n in self.names]
        if any(not math.isfinite(w) or w < 0 for w in values) or sum(values) <= 0:
            raise ValueError(f"{what} returned {dict(weights)}; weights must be finite, >= 0, with a positive sum.")
        total = sum(values)
        return [w / total for w in values]

    # -- the weight source ----------------------------------------------------------------------
    def timeline(self, datamodule: Any, base: WeightTimeline | None) -> OnlineTimeline:
        """The train stream's weight source: a new shared table holding the history, and its timeline.

        Args:
            datamodule: the ``TextDataModule`` (loader, packing and Trainer settings).
            base: the schedule's or caps' timeline (``None``: the managers' weights).
        """
        trainer = getattr(datamodule, "trainer", None)
        world = int(getattr(trainer, "world_size", 1) or 1)
        accumulate = int(getattr(trainer, "accumulate_grad_batches", 1) or 1)
        per_step = world * datamodule.batch_size * accumulate
        count, per_position, read_ahead = "documents", float(per_step), 0.0
        if datamodule.packing is not None:  # a clock of full packs: never ahead of the packs handed out
            count, per_position = "tokens", float(per_step * datamodule.max_seq_len)
            read_ahead = self._read_ahead_steps(datamodule, per_position, world)
        scale = 1.0
        if base is not None:
            if base.count != count:
                raise ValueError("TextDataModule.mix_controller with mix_schedule.unit 'tokens' needs packing (the "
                                 "controller's updates are counted in steps); use unit: steps, or packing.")
            scale = per_position / base.counts_per_position
        options = datamodule.train_options
        needed = weights_delay(options.num_workers, options.prefetch_factor, accumulate, read_ahead)
        self.delay = max(needed, int((self._saved or {}).get("delay", 0)))
        start = base.weights(0) if base is not None else list(datamodule.train_source_weights.values())
        if not self.started:
            getattr(self.controller, "start", lambda weights: None)(dict(zip(self.names, start)))
            self.started = True
        max_steps = getattr(trainer, "max_steps", -1) or -1
        capacity = max_steps // self.every + 2 if max_steps > 0 else _DEFAULT_CAPACITY
        version0 = [1.0 / len(self.names)] * len(self.names) if base is not None else start
        self.versions = WeightVersions(self.names, version0, max(capacity, len(self.history) + 2),
                                       what=f"TextDataModule.mix_update_every={self.every}, delay {self.delay} steps")
        self.versions.load([w for _, w in self.history])
        self.weight_source = OnlineTimeline(self.names, self.versions, self.every, self.delay, count, per_position, base,
                                            scale, description=f"online every={self.every} {type(self.controller).__name__}")
        return self.weight_source

    def targets_at(self, step: float) -> dict[str, float] | None:
        """The weights the stream draws by at optimizer step ``step`` (the controller's, times the
        schedule's; ``None`` before the train stream exists)."""
        timeline = self.weight_source
        return None if timeline is None else timeline.weights_at(step * timeline.scale)

    def _read_ahead_steps(self, datamodule: Any, per_position: float, world: int) -> float:
        """Steps the packer reads ahead: a block of documents (at twice the longest source's mean
        length) and its open packs, on each of a rank's shards."""
        means = []
        for name, manager in datamodule.dataset_managers.get("train", {}).items():
            size, _ = source_size(manager, datamodule._datasets["train"].get(name), None, datamodule.overlong)
            means.append(size.mean_tokens or datamodule.max_seq_len)
        documents = min(read_ahead_documents(), ONLINE_BLOCK_DOCUMENTS)
        tokens = documents * 2 * max(means or [datamodule.max_seq_len]) + \
            datamodule.packing_buffer_size * datamodule.max_seq_len
        return tokens * world * max(1, datamodule.num_workers) / per_position

    # -- state --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The controller's state, the published weights and every rank's interval sums (a collective under DDP)."""
        sums = self._sums.cpu().tolist() if self._sums is not None else [[0.0] * len(self.names)] * 2
        own = {"loss_sum": sums[0], "tokens": sums[1], "documents": list(self._documents)}
        _, world = current_rank_and_world_size()
        ranks: list[Any] = [own]
        if world > 1:
            ranks = [None] * world
            dist.all_gather_object(ranks, own)
        return {"every": self.every, "delay": self.delay, "names": list(self.names), "last_update": self.last_update,
                "history": [[s, list(w)] for s, w in self.history], "controller": self.controller.state_dict(),
                "ranks": ranks}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        """Continue from a :meth:`state_dict` (``None``: the checkpoint had no controller; start afresh).

        Raises:
            ValueError: the checkpoint's controller updated at another interval or over other sources.
        """
        if not state:
            return
        if int(state["every"]) != self.every:
            raise ValueError(f"Cannot resume online mixing: the checkpoint updated the weights every {state['every']} "
                             f"steps, TextDataModule.mix_update_every is {self.every}; set mix_update_every: "
                             f"{state['every']} to resume.")
        if list(state["names"]) != self.names:
            raise ValueError(f"Cannot resume online mixing: the checkpoint's train sources are {state['names']}, now "
                             f"{self.names}; restore the sources or resume without the data state.")
        self._saved = dict(state)
        self.history = [(int(s), [float(x) for x in w]) for s, w in state["history"]]
        self.last_update = int(state["last_update"])
        self.controller.load_state_dict(state["controller"])
        self.started = True
        rank, world = current_rank_and_world_size()
        ranks = list(state["ranks"])
        if len(ranks) == world:
            own = ranks[rank]
        else:  # another world size: rank 0 carries the old ranks' sums
            own = {key: [sum(r[key][i] for r in ranks) if rank == 0 else 0.0 for i in range(len(self.names))]
                   for key in ("loss_sum", "tokens", "documents")}
        self._sums = torch.tensor([own["loss_sum"], own["tokens"]], dtype=torch.float64)
        self._documents = [float(d) for d in own["documents"]]


def train_timeline(datamodule: Any) -> Any:
    """The weight source a datamodule's train stream draws by: the schedule's (or caps') timeline, with
    the controller's weights on it when there is one (``None``: the managers' fixed weights).

    Args:
        datamodule: the ``TextDataModule`` whose train datasets are set up.
    """
    base = datamodule.mixture.timeline_for(datamodule)
    control = datamodule.mix_control
    return base if control is None else control.timeline(datamodule, base)


def with_mix_state(datamodule: Any, state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (the data state) with the online mixing state added when there is a controller.

    Args:
        datamodule: the ``TextDataModule``.
        state: its data state.
    """
    control = datamodule.mix_control
    return state if control is None else {**state, MIX_CONTROL_KEY: control.state_dict()}


def load_mix_state(datamodule: Any, state: Mapping[str, Any]) -> None:
    """Give a checkpoint's online mixing state to the datamodule's controller (warn when it has none).

    Args:
        datamodule: the ``TextDataModule``.
        state: the checkpoint's data state.
    """
    saved = state.get(MIX_CONTROL_KEY) if state else None
    if datamodule.mix_control is not None:
        datamodule.mix_control.load_state_dict(saved)
    elif saved:
        rank_zero_warn("The checkpoint holds an online mixing controller's state, but this TextDataModule has no "
                       "mix_controller; the mix follows the configured weights from the resume on.")
