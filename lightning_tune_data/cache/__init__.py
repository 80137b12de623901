"""Where and how bytes are stored: fingerprints, atomic builds, checksums and cache records.

Every other part of the package asks this one where a cache lives and whether it is complete.

* :mod:`~lightning_tune_data.cache.fingerprints`: the hash that keys a cache;
* :mod:`~lightning_tune_data.cache.layout`: folder, lock and temporary-folder names in a cache root;
* :mod:`~lightning_tune_data.cache.marker`: the completion marker that makes a folder a cache;
* :mod:`~lightning_tune_data.cache.store`: the crash-safe, lock-guarded build;
* :mod:`~lightning_tune_data.cache.checksums`: content hashes of data files and cache files;
* :mod:`~lightning_tune_data.cache.saved_dataset`: the tokenized dataset and its manifest;
* :mod:`~lightning_tune_data.cache.records`: what a build recorded, and what changed since;
* :mod:`~lightning_tune_data.cache.sizes`: how much room caches take.
"""

from lightning_tune_data.cache.fingerprints import callable_identity, canonical_json, fingerprint
from lightning_tune_data.cache.marker import COMPLETE_MARKER, is_valid_cache, read_cache_metadata
from lightning_tune_data.cache.sizes import human_size, tree_size
from lightning_tune_data.cache.store import CacheReadOnlyError, build_cache_atomically, check_complete_cache

__all__ = [
    "COMPLETE_MARKER",
    "CacheReadOnlyError",
    "build_cache_atomically",
    "callable_identity",
    "canonical_json",
    "check_complete_cache",
    "fingerprint",
    "human_size",
    "is_valid_cache",
    "read_cache_metadata",
    "tree_size",
]
