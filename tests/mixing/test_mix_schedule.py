"""MixSchedule and MixPoint: the config of a mixture schedule, its checks, positions and interpolation."""

from __future__ import annotations

import pytest

from lightning_tune_data.mixing.mix_schedule import MixPoint, MixSchedule, interpolated, parse_count


@pytest.mark.parametrize(("text", "value"), [(30000, 30000.0), ("30k", 3e4), ("2.5M", 2.5e6), ("40B", 4e10),
                                             ("1T", 1e12), (" 7 ", 7.0)])
def test_counts_are_read_with_their_suffixes(text, value) -> None:
    assert parse_count(text) == value


@pytest.mark.parametrize("bad", ["40 GB", "-3", -1, True, "x"])
def test_a_bad_count_names_the_field_and_the_forms_it_takes(bad) -> None:
    with pytest.raises(ValueError, match=r"max_tokens: .* is not a count; write a number >= 0 such as"):
        parse_count(bad, "max_tokens")


def test_a_mapping_becomes_a_schedule_with_points_at_fractions_or_counts() -> None:
    schedule = MixSchedule.from_config({"unit": "tokens", "interpolation": "cosine", "points": [
        {"at": 0, "weights": {"web": 7, "code": 3}}, {"at": "40B", "weights": {"web": 1, "code": 1}},
        {"at": 1.0, "weights": {"math": 1}}]})
    assert schedule.points[1] == MixPoint(at="40B", weights={"web": 1, "code": 1})
    resolved = schedule.resolved(["web", "code", "math"], run_length=1e11)
    assert resolved == [(0.0, [0.7, 0.3, 0.0]), (4e10, [0.5, 0.5, 0.0]), (1e11, [0.0, 0.0, 1.0])]
    assert schedule.uses_fractions()


@pytest.mark.parametrize(("config", "message"), [
    ({"points": []}, r"mix_schedule.points: no point"),
    ({"unit": "epochs", "points": [{"at": 0, "weights": {"a": 1}}]}, r"mix_schedule.unit: 'epochs'"),
    ({"interpolation": "cubic", "points": [{"at": 0, "weights": {"a": 1}}]}, r"mix_schedule.interpolation"),
    ({"points": [{"at": 0, "weights": {"a": -1}}]}, r"points\[0\].weights.a: -1 is not a finite number >= 0"),
    ({"points": [{"at": 0, "weights": {"a": 0}}]}, r"points\[0\].weights: .* sum to 0"),
    ({"points": [{"at": 2.5, "weights": {"a": 1}}]}, r"points\[0\].at: 2.5; a float must be a fraction"),
    ({"points": [{"at": 0, "weigths": {"a": 1}}]}, r"points\[0\]: .* write \{at: ..., weights"),
    ({"stages": []}, r"unknown keys \['stages'\]"),
])
def test_a_schedule_that_cannot_be_followed_is_refused_naming_the_field(config, message) -> None:
    with pytest.raises(ValueError, match=message):
        MixSchedule.from_config(config)


def test_resolving_refuses_unknown_sources_unordered_points_and_fractions_without_a_run_length() -> None:
    schedule = MixSchedule.from_config({"points": [{"at": 0.5, "weights": {"a": 1}}, {"at": 10, "weights": {"b": 1}}]})
    with pytest.raises(ValueError, match=r"\['b'\] are not train sources"):
        schedule.resolved(["a"], 100)
    with pytest.raises(ValueError, match=r"points\[1\].at: 10 comes before the previous point's 0.5"):
        schedule.resolved(["a", "b"], 100)
    with pytest.raises(ValueError, match="set the Trainer's max_steps"):
        schedule.resolved(["a", "b"], None)


def test_interpolation_between_two_points() -> None:
    assert interpolated([1.0, 0.0], [0.0, 1.0], 0.25, "linear") == [0.75, 0.25]
    assert interpolated([1.0, 0.0], [0.0, 1.0], 0.25, "step") == [1.0, 0.0]
    cosine = interpolated([1.0, 0.0], [0.0, 1.0], 0.25, "cosine")
    assert cosine[1] == pytest.approx((1 - 2 ** -0.5) / 2) and sum(cosine) == pytest.approx(1.0)


def test_the_description_changes_with_any_point() -> None:
    one = MixSchedule.from_config({"points": [{"at": 0, "weights": {"a": 1, "b": 1}}]})
    two = MixSchedule.from_config({"points": [{"at": 0, "weights": {"a": 1, "b": 2}}]})
    assert one.describe() != two.describe() and one.describe() == MixSchedule.from_config(one).describe()
