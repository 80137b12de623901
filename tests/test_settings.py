"""Run-wide stream settings: one frozen object, validated once."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from lightning_tune_data.settings import StreamSettings


def test_settings_are_frozen_and_changes_make_a_copy() -> None:
    settings = StreamSettings(seed=7, rank=1, world_size=2, max_seq_len=64)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.seed = 8  # type: ignore[misc]
    changed = settings.with_changes(max_seq_len=None)
    assert changed.max_seq_len is None and settings.max_seq_len == 64 and changed.seed == 7


def test_settings_pickle_into_dataloader_workers_unchanged() -> None:
    settings = StreamSettings(seed=3, num_passes=1, overlong="drop")
    assert pickle.loads(pickle.dumps(settings)) == settings


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"overlong": "cut"}, r"overlong='cut'; use one of \['truncate', 'drop'\]"),
        ({"num_passes": 0}, r"num_passes must be >= 1 or None, got 0"),
        ({"rank": 2, "world_size": 2}, r"rank 2 is outside world_size 2"),
    ],
)
def test_bad_settings_fail_with_the_field_and_the_allowed_values(changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StreamSettings(**changes)
