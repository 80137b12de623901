"""Fingerprints: a stable hash of everything that changes a cache's content.

The inputs of a cache (source spec, data-file identities, preprocess function, tokenizer, ...) are
serialised to canonical JSON (sorted keys, callables described by their code) and hashed together
with the package version and :data:`CACHE_FORMAT_VERSION`, so that any change to them, or to the
on-disk layout, selects another cache.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
from collections.abc import Mapping
from typing import Any

import lightning_tune_data.version as package_version

__all__ = ["CACHE_FORMAT_VERSION", "callable_identity", "canonical_json", "fingerprint", "json_default"]

#: Bump when the on-disk layout of caches changes; it is part of every fingerprint and marker.
CACHE_FORMAT_VERSION = 2


def callable_identity(fn: Any) -> dict[str, Any]:
    """Describe a callable so that editing its code changes the description.

    Args:
        fn: A function, ``functools.partial``, bound method or callable object.

    Returns:
        ``{"module", "qualname", "source_sha256"}`` (``source_sha256`` is ``None`` when the source
        is unavailable, e.g. for builtins); partials also record their bound arguments.
    """
    if isinstance(fn, functools.partial):
        return {
            "partial": callable_identity(fn.func),
            "args": list(fn.args),
            "keywords": dict(fn.keywords),
        }
    target = getattr(fn, "__func__", fn)  # bound methods: the function
    if not (inspect.isfunction(target) or inspect.isclass(target) or inspect.isbuiltin(target)):
        target = type(target)  # callable instances: their class
    try:
        source_hash: str | None = hashlib.sha256(inspect.getsource(target).encode()).hexdigest()
    except (OSError, TypeError):
        source_hash = None
    return {
        "module": getattr(target, "__module__", None),
        "qualname": getattr(target, "__qualname__", repr(target)),
        "source_sha256": source_hash,
    }


def json_default(value: Any) -> Any:
    """The JSON form of a value ``json`` cannot serialise itself (``json.dumps(default=...)``).

    Paths become strings, sets sorted lists, bytes hex, numpy scalars numbers and callables their
    :func:`callable_identity`; anything else its ``repr`` and type, unless that repr holds a memory
    address (it would differ in every run and so never find the cache again).

    Args:
        value: The value to describe.

    Raises:
        TypeError: The value's repr is not stable across runs.
    """
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, bytes):
        return value.hex()
    if hasattr(value, "item") and callable(value.item):  # numpy scalars
        return value.item()
    if callable(value):
        return callable_identity(value)
    text = repr(value)
    if " at 0x" in text:
        raise TypeError(
            f"cannot fingerprint a value of type {type(value).__name__} ({text}): its repr is not "
            f"stable across runs. Use plain JSON values (str, int, float, bool, list, dict) in "
            f"configuration that keys the cache."
        )
    return {"repr": text, "type": f"{type(value).__module__}.{type(value).__qualname__}"}


def canonical_json(obj: Any) -> str:
    """Serialise ``obj`` deterministically (sorted keys, no whitespace) for hashing/comparison.

    Args:
        obj: JSON-like data; other values are described by :func:`json_default`.
    """
    return json.dumps(
        obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=json_default
    )


def fingerprint(parts: Mapping[str, Any]) -> str:
    """Stable sha256 hex digest of everything that changes a cache's content.

    The package version and :data:`CACHE_FORMAT_VERSION` are added here, so callers pass only
    their own parts (source spec, data-file identities, preprocess function identity and kwargs,
    tokenizer identity, ...).

    Args:
        parts: JSON-like description; paths, sets and callables are canonicalised.

    Returns:
        64 hex characters.
    """
    payload = {
        "parts": dict(parts),
        "package_version": package_version.__version__,
        "cache_format": CACHE_FORMAT_VERSION,
    }
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()
