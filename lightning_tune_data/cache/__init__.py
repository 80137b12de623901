"""Where and how bytes are stored: fingerprints, atomic builds, checksums and cache records.

Every other part of the package asks this one where a cache lives and whether it is complete.
"""

from lightning_tune_data.cache.store import (
    COMPLETE_MARKER,
    CacheReadOnlyError,
    build_cache_atomically,
    callable_identity,
    fingerprint,
    is_valid_cache,
    read_cache_metadata,
)

__all__ = [
    "COMPLETE_MARKER",
    "CacheReadOnlyError",
    "build_cache_atomically",
    "callable_identity",
    "fingerprint",
    "is_valid_cache",
    "read_cache_metadata",
]
