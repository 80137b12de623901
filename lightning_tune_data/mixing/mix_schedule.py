"""A mixture schedule as a config states it: weights that change over the run, point by point.

``MixSchedule(points=[MixPoint(at=0, weights={...}), ...], unit="steps", interpolation="linear")``
is what ``TextDataModule(mix_schedule=...)`` takes, in Python or YAML. ``at`` is where a point sits:
a float in ``[0, 1]`` is a fraction of the run (``max_steps``); an int, or a count such as
``"40B"``, ``"30k"`` or ``"30000"``, is an absolute number of the schedule's ``unit`` (optimizer
steps, or train tokens). Between two points the weights go ``"step"`` (jump at the next point),
``"linear"`` or ``"cosine"``; before the first point the first point's weights hold, after the
last the last's. Each point's weights are normalised to sum to 1 before interpolating. A train
source a point does not name has weight 0 there.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from lightning_tune_data.keys import INTERPOLATIONS, SCHEDULE_UNITS, Interpolation, ScheduleUnit

__all__ = ["MixPoint", "MixSchedule", "parse_count", "interpolated"]

#: Suffixes a count may carry: thousands, millions, billions, trillions.
_SUFFIXES = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}
_COUNT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([kKmMbBtT]?)\s*$")


def parse_count(value: int | float | str, what: str = "count") -> float:
    """A count as configs write it: ``30000``, ``"30k"``, ``"2.5M"``, ``"40B"``, ``"1T"``.

    Args:
        value: the count.
        what: what the count is, for the error message.
    """
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if math.isfinite(value) and value >= 0:
            return float(value)
    elif isinstance(value, str):
        match = _COUNT.match(value)
        if match:
            return float(match.group(1)) * _SUFFIXES[match.group(2).upper()]
    raise ValueError(f"{what}: {value!r} is not a count; write a number >= 0 such as 30000, '30k', '2.5M' or '40B'.")


@dataclass
class MixPoint:
    """One point of a mixture schedule.

    Args:
        at: where the point sits: a float in ``[0, 1]`` is a fraction of the run (``max_steps``);
            an int or a count string (``"40B"``) counts the schedule's unit.
        weights: weight per train source at this point (finite, >= 0, a positive sum; normalised).
    """

    at: float | int | str
    weights: dict[str, float]


@dataclass
class MixSchedule:
    """Train-source weights that change over the run (see the module docstring).

    Args:
        points: the schedule's points, in order of ``at``.
        unit: what an absolute ``at`` counts: ``"steps"`` (optimizer steps) or ``"tokens"``
            (train tokens the mixture drew).
        interpolation: ``"step"``, ``"linear"`` or ``"cosine"`` between consecutive points.
    """

    points: list[MixPoint] = field(default_factory=list)
    unit: ScheduleUnit = "steps"
    interpolation: Interpolation = "linear"

    @classmethod
    def from_config(cls, value: MixSchedule | Mapping[str, Any]) -> MixSchedule:
        """A schedule from itself or from a plain mapping (``{"unit": ..., "points": [{"at": ..., "weights": ...}]}``).

        Args:
            value: a :class:`MixSchedule` or the mapping a config gives.
        """
        if isinstance(value, MixSchedule):
            schedule = value
        elif isinstance(value, Mapping):
            unknown = sorted(set(value) - {"points", "unit", "interpolation"})
            if unknown:
                raise ValueError(f"TextDataModule.mix_schedule: unknown keys {unknown}; use points, unit, interpolation.")
            points = [p if isinstance(p, MixPoint) else _point(i, p) for i, p in enumerate(value.get("points") or [])]
            schedule = cls(points=points, unit=value.get("unit", "steps"),
                           interpolation=value.get("interpolation", "linear"))
        else:
            raise ValueError(f"TextDataModule.mix_schedule: expected a mapping with points, got {type(value).__name__}.")
        schedule.check()
        return schedule

    def check(self) -> None:
        """Refuse a schedule that cannot be followed (each message names the field and the fix)."""
        if self.unit not in SCHEDULE_UNITS:
            raise ValueError(f"TextDataModule.mix_schedule.unit: {self.unit!r}; use one of {list(SCHEDULE_UNITS)}.")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"TextDataModule.mix_schedule.interpolation: {self.interpolation!r}; "
                             f"use one of {list(INTERPOLATIONS)}.")
        if not self.points:
            raise ValueError("TextDataModule.mix_schedule.points: no point; give at least one {at, weights}.")
        for i, point in enumerate(self.points):
            where = f"TextDataModule.mix_schedule.points[{i}]"
            _position(point.at, where)
            if not isinstance(point.weights, Mapping) or not point.weights:
                raise ValueError(f"{where}.weights: give a mapping of train source -> weight.")
            for name, weight in point.weights.items():
                if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight) or weight < 0:
                    raise ValueError(f"{where}.weights.{name}: {weight!r} is not a finite number >= 0.")
            if sum(point.weights.values()) <= 0:
                raise ValueError(f"{where}.weights: {dict(point.weights)} sum to 0; give a source a positive weight.")

    def uses_fractions(self) -> bool:
        """Whether some point sits at a fraction of the run (which needs ``max_steps``)."""
        return any(fraction and value > 0 for value, fraction in (_position(p.at, "") for p in self.points))

    def resolved(self, names: Sequence[str], run_length: float | None) -> list[tuple[float, list[float]]]:
        """``(position, normalised weights in ``names`` order)`` per point, positions in the unit.

        Args:
            names: the train sources, in order (a point naming another source is an error).
            run_length: the run's length in the unit (fractions are of it); ``None`` when unknown.
        """
        points = []
        for i, point in enumerate(self.points):
            where = f"TextDataModule.mix_schedule.points[{i}]"
            unknown = sorted(set(point.weights) - set(names))
            if unknown:
                raise ValueError(f"{where}.weights: {unknown} are not train sources (they are {list(names)}); "
                                 "name train sources only.")
            value, fraction = _position(point.at, where)
            if fraction and value > 0:  # 0 is the start of any run
                if run_length is None:
                    raise ValueError(f"{where}.at: {point.at!r} is a fraction of the run, but the run's length is "
                                     "unknown here; set the Trainer's max_steps, or give `at` as a count.")
                value *= run_length
            weights = [float(point.weights.get(n, 0.0)) for n in names]
            total = sum(weights)
            if total <= 0:
                raise ValueError(f"{where}.weights: no train source has a positive weight; give one.")
            points.append((value, [w / total for w in weights]))
        for i in range(1, len(points)):
            if points[i][0] < points[i - 1][0]:
                raise ValueError(f"TextDataModule.mix_schedule.points[{i}].at: {self.points[i].at!r} comes before "
                                 f"the previous point's {self.points[i - 1].at!r}; order the points by `at`.")
        return points

    def describe(self) -> str:
        """A canonical text of the schedule (what a checkpoint compares on resume)."""
        return json.dumps({"unit": self.unit, "interpolation": self.interpolation,
                           "points": [[str(p.at), {k: float(v) for k, v in sorted(p.weights.items())}]
                                      for p in self.points]}, sort_keys=True)


def interpolated(start: list[float], end: list[float], t: float, interpolation: str) -> list[float]:
    """The weights a fraction ``t`` of the way from ``start`` to ``end``.

    Args:
        start, end: normalised weights at the two points.
        t: how far between them, in ``[0, 1]``.
        interpolation: ``"step"`` (``start`` until the end point), ``"linear"`` or ``"cosine"``.
    """
    if interpolation == "step":
        return list(start)
    if interpolation == "cosine":
        t = (1.0 - math.cos(math.pi * t)) / 2.0
    return [a + (b - a) * t for a, b in zip(start, end)]


def _point(index: int, value: Any) -> MixPoint:
    if not isinstance(value, Mapping) or set(value) != {"at", "weights"}:
        raise ValueError(f"TextDataModule.mix_schedule.points[{index}]: {value!r}; write {{at: ..., weights: {{...}}}}.")
    return MixPoint(at=value["at"], weights=dict(value["weights"]))


def _position(at: Any, where: str) -> tuple[float, bool]:
    """``(value, is a fraction of the run)`` of a point's ``at``."""
    if isinstance(at, float) and 0.0 <= at <= 1.0:
        return at, True
    if isinstance(at, float) and not at.is_integer():
        raise ValueError(f"{where}.at: {at!r}; a float must be a fraction of the run in [0, 1], "
                         "else give a whole count such as 30000 or '40B'.")
    return parse_count(at, f"{where}.at"), False
