"""stream_settings / settings_property: a source's run-wide values come from keywords or one StreamSettings."""

from __future__ import annotations

import pytest

from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.stream_arguments import settings_property, stream_settings


def test_keywords_become_settings_and_given_settings_are_used_as_they_are():
    built = stream_settings(None, "src", seed=5, rank=1, world_size=2, num_passes=None, max_seq_len=9, overlong="drop")
    assert built == StreamSettings(seed=5, rank=1, world_size=2, max_seq_len=9, overlong="drop")
    given = StreamSettings(seed=5)
    assert stream_settings(given, "src", seed=0, rank=0, world_size=1) is given


def test_keywords_build_settings_that_check_themselves():
    with pytest.raises(ValueError, match="rank 2 is outside world_size 2"):
        stream_settings(None, "src", rank=2, world_size=2)


def test_a_keyword_changed_from_its_default_next_to_settings_is_refused_naming_it():
    with pytest.raises(ValueError, match="Source 'web': rank, world_size, overlong given both as keyword argument and in settings"):
        stream_settings(StreamSettings(), "web", seed=0, rank=1, world_size=2, overlong="drop")


def test_settings_property_reads_the_field_of_its_objects_settings_and_cannot_be_set():
    class Holder:
        seed = settings_property("seed")

        def __init__(self, settings: StreamSettings) -> None:
            self.settings = settings

    holder = Holder(StreamSettings(seed=11))
    assert holder.seed == 11 and "settings.seed" in Holder.seed.__doc__
    holder.settings = StreamSettings(seed=12)
    assert holder.seed == 12
    with pytest.raises(AttributeError):
        holder.seed = 3
