"""Controllers that set the train mixture's weights from the training loss: :class:`MixController`
and the built-in :class:`OnlineDataMixing`.

A controller is asked for new weights every ``mix_update_every`` optimizer steps
(``TextDataModule(mix_controller=..., mix_update_every=N)``). It gets, per train source, the
interval's statistics summed over every rank (so every rank computes the same weights):

* ``loss``: the mean loss per target token of that source's tokens in the interval (absent, and
  ``tokens`` 0, when no token of the source was trained on in the interval);
* ``tokens``: the source's target tokens in the interval;
* ``documents``: the documents of the source that started in the interval.

It returns the new weights by source name (finite, >= 0, a positive sum; normalised by the
caller). Its ``state_dict()`` goes into the checkpoint, so a resumed run continues its decisions
exactly. A controller must be deterministic: the same statistics give the same weights.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

__all__ = ["MixController", "OnlineDataMixing", "exploration_rate", "odm_policy"]


class MixController(ABC):
    """The protocol of a mixture controller (subclass it, or give any object with these methods).

    :meth:`start` is called once, before the first update, with the weights the run starts with.
    """

    def start(self, weights: Mapping[str, float]) -> None:
        """The weights in effect before the first update, by source name (normalised).

        Args:
            weights: the starting weights.
        """

    @abstractmethod
    def update(self, step: int, stats: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
        """New weights by source name, from the interval that ended at optimizer step ``step``.

        Args:
            step: the optimizer step the interval ended at (a multiple of ``mix_update_every``).
            stats: per source, the interval's ``loss``, ``tokens`` and ``documents`` (see the module).
        """

    def state_dict(self) -> dict[str, Any]:
        """Everything the next decisions depend on (plain Python values)."""
        return {}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict`.

        Args:
            state_dict: what :meth:`state_dict` returned.
        """


def exploration_rate(t: int, k: int) -> float:
    """ODM's exploration rate ``eps_t = min(1/K, sqrt(ln K / (K t)))`` (``1/K`` at ``t = 0``).

    Args:
        t: the update's index (1 for the first update).
        k: the number of sources.
    """
    if t <= 0 or k <= 1:
        return 1.0 / k
    return min(1.0 / k, math.sqrt(math.log(k) / (k * t)))


def odm_policy(rewards: list[float], eps_previous: float, eps: float) -> list[float]:
    """ODM's sampling distribution ``pi_i = (1 - K eps_t) softmax(eps_{t-1} R)_i + eps_t``.

    Args:
        rewards: the estimated rewards ``R``, one per source.
        eps_previous: ``eps_{t-1}`` (the softmax's temperature).
        eps: ``eps_t`` (the uniform exploration floor).
    """
    k = len(rewards)
    scaled = [eps_previous * r for r in rewards]
    top = max(scaled)
    exps = [math.exp(s - top) for s in scaled]
    total = sum(exps)
    return [(1.0 - k * eps) * e / total + eps for e in exps]


class OnlineDataMixing(MixController):
    """ODM: the EXP3 bandit of Albalak, Pan, Raffel and Wang, "Efficient Online Data Mixing For
    Language Model Pre-Training" (2023, arXiv:2312.02406), with the training loss as reward.

    Each source is an arm. At update ``t`` (``t = 1, 2, ...``), for every source ``i`` trained on
    in the interval, the reward estimate takes the interval's mean loss ``L_i``, importance-weighted
    by the probability ``pi_i`` it was sampled with (the weights of the previous update)::

        R_i <- alpha * R_i + (1 - alpha) * L_i / pi_i

    (a source with no token in the interval keeps its ``R_i``, as an arm not pulled). Then::

        eps_t = min(1/K, sqrt(ln K / (K t)))
        pi_i  = (1 - K eps_t) * exp(eps_{t-1} R_i) / sum_j exp(eps_{t-1} R_j) + eps_t

    with ``eps_0 = 1/K`` and ``R = 0`` at the start. Sources whose loss stays high are sampled
    more; every source keeps at least ``eps_t``. The paper draws one domain per step; here the
    statistics of ``mix_update_every`` steps form one pull per source, and ``pi`` before the
    first update is the run's starting weights.

    Args:
        alpha: the smoothing of the reward estimate (the paper's 0.9).
        warmup_updates: updates that only accumulate rewards and keep the starting weights.
    """

    def __init__(self, alpha: float = 0.9, warmup_updates: int = 0) -> None:
        if not 0.0 <= float(alpha) < 1.0:
            raise ValueError(f"OnlineDataMixing: alpha must be in [0, 1), got {alpha}.")
        if int(warmup_updates) < 0:
            raise ValueError(f"OnlineDataMixing: warmup_updates must be >= 0, got {warmup_updates}.")
        self.alpha = float(alpha)
        self.warmup_updates = int(warmup_updates)
        self.names: list[str] = []
        self.rewards: list[float] = []
        self.policy: list[float] = []
        self.starting: list[float] = []
        self.t = 0

    def start(self, weights: Mapping[str, float]) -> None:
        """Begin with ``weights`` as the sampling probabilities (rewards 0).

        Args:
            weights: the starting weights by source name.
        """
        if self.names:  # restored from a checkpoint: keep what it says
            return
        self.names = list(weights)
        total = float(sum(weights.values()))
        self.starting = [float(weights[n]) / total for n in self.names]
        self.policy = list(self.starting)
        self.rewards = [0.0] * len(self.names)

    def update(self, step: int, stats: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
        """One EXP3 update from the interval's per-source losses (see the class docstring).

        Args:
            step: the optimizer step (unused: the update count ``t`` drives the rates).
            stats: per source, ``loss`` and ``tokens`` of the interval.
        """
        if not self.names:
            self.start({name: 1.0 for name in stats})
        self.t += 1
        for i, name in enumerate(self.names):
            entry = stats.get(name) or {}
            if float(entry.get("tokens", 0.0)) > 0 and "loss" in entry:
                reward = float(entry["loss"]) / max(self.policy[i], 1e-12)
                self.rewards[i] = self.alpha * self.rewards[i] + (1.0 - self.alpha) * reward
        if self.t > self.warmup_updates:
            k = len(self.names)
            self.policy = odm_policy(self.rewards, exploration_rate(self.t - 1, k), exploration_rate(self.t, k))
        return dict(zip(self.names, self.policy))

    def state_dict(self) -> dict[str, Any]:
        """Sources, rewards, current probabilities and the update count."""
        return {"names": list(self.names), "rewards": list(self.rewards), "policy": list(self.policy),
                "starting": list(self.starting), "t": self.t, "alpha": self.alpha}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict`.

        Args:
            state_dict: what :meth:`state_dict` returned.
        """
        self.names = list(state_dict["names"])
        self.rewards = [float(r) for r in state_dict["rewards"]]
        self.policy = [float(p) for p in state_dict["policy"]]
        self.starting = [float(p) for p in state_dict.get("starting", self.policy)]
        self.t = int(state_dict["t"])
