"""How a source's run-wide keyword arguments become the one :class:`StreamSettings` it reads.

A source takes the values every stage of a rank's stream shares (seed, rank, world_size,
num_passes, max_seq_len, overlong) either one keyword at a time, or all at once as ``settings``
(the object the datamodule hands to every source, the mixer and the packer). Either way the source
keeps them in one ``settings`` attribute and reads them from there; its former attributes of the
same names stay readable through :func:`settings_property`.
"""

from __future__ import annotations

import operator
from typing import Any

from lightning_tune_data.settings import StreamSettings

__all__ = ["settings_property", "stream_settings"]

_DEFAULTS = StreamSettings()


def stream_settings(settings: StreamSettings | None, source: str, **keywords: Any) -> StreamSettings:
    """The settings a source reads: ``settings`` when given, else its keyword arguments as settings.

    Args:
        settings: the run-wide settings, or ``None`` to build them from ``keywords``.
        source: the source's name (for the error below).
        keywords: the source's keyword arguments of the same names as settings fields. With
            ``settings`` given they must keep their defaults: a value given twice is refused
            rather than silently ignored.

    Raises:
        ValueError: ``settings`` is given and a keyword differs from its default.
    """
    if settings is None:
        return StreamSettings(**keywords)
    given_twice = [name for name, value in keywords.items() if value != getattr(_DEFAULTS, name)]
    if given_twice:
        raise ValueError(
            f"Source '{source}': {', '.join(given_twice)} given both as keyword argument and in settings; "
            "give them in settings only."
        )
    return settings


def settings_property(name: str) -> property:
    """A read-only attribute that reads field ``name`` of its object's ``settings``.

    Args:
        name: a :class:`StreamSettings` field.
    """
    return property(operator.attrgetter(f"settings.{name}"), doc=f"``settings.{name}`` (read-only).")
