"""Where and how bytes are stored: fingerprints, atomic builds, checksums and cache records.

Every other part of the package asks this one where a cache lives and whether it is complete.

* :mod:`~lightning_tune_data.cache.fingerprints`: the hash that keys a cache;
* :mod:`~lightning_tune_data.cache.layout`: folder, lock and temporary-folder names in a cache root;
* :mod:`~lightning_tune_data.cache.marker`: the completion marker that makes a folder a cache;
* :mod:`~lightning_tune_data.cache.store`: the crash-safe, lock-guarded build;
* :mod:`~lightning_tune_data.cache.checksums`: content hashes of data files and cache files;
* :mod:`~lightning_tune_data.cache.root`: where a cache root lives (local or any fsspec URL);
* :mod:`~lightning_tune_data.cache.store_files`: a store folder's files on that filesystem;
* :mod:`~lightning_tune_data.cache.shards`: a token store's Arrow shards, written and memory-mapped;
* :mod:`~lightning_tune_data.cache.tasks`: the tasks that write a store and the commit;
* :mod:`~lightning_tune_data.cache.store_reader`: opening a committed store;
* :mod:`~lightning_tune_data.cache.mirror`: whole-store downloads and uploads, verified;
* :mod:`~lightning_tune_data.cache.verified`: which files were verified, in what state;
* :mod:`~lightning_tune_data.cache.saved_dataset`: the layout of earlier versions, still read;
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
