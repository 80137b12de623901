"""``lightning-tune-data cache verify``, and ``cache list|clean`` on a remote cache root.

``verify`` re-hashes every file of every committed store under a root (local or remote) and
compares it with the checksum recorded when it was written: the full check that opening a store
skips (opening compares sizes, and hashes only files changed since they were last verified).

On a remote root (``s3://bucket/prefix``, ...), ``list`` shows each store with its rows, tokens
and size, committed or not (naming the unfinished tasks), and ``clean`` removes the stores that
are not committed or were written by another version of the package (``--all``: every store).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import xxhash

from lightning_tune_data.cache.window_plan import WINDOWS_KEPT
from lightning_tune_data.cache.checksums import CHECKSUM_ALGORITHM, READ_CHUNK_BYTES, verify_files
from lightning_tune_data.cache.marker import COMPLETE_MARKER, marker_matches, read_cache_metadata
from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.cache.sizes import human_size
from lightning_tune_data.cache.store_files import StoreFiles, store_folders
from lightning_tune_data.cache.task_lease import STALE_AFTER_S, uncommitted_status
from lightning_tune_data.version import __version__

__all__ = ["RemoteStore", "clean_remote", "list_remote", "remote_stores", "store_details", "verify_root"]


@dataclass
class RemoteStore:
    """One store folder under a remote root, as ``cache list`` shows it."""

    files: StoreFiles
    source: str
    size: int
    rows: int | None
    stale: str | None
    status: str = "committed"

    def row(self) -> list[str]:
        """The store's cells: name, size, source, rows, status."""
        rows = f"{self.rows:,} rows" if self.rows is not None else "-"
        return [self.files.name, human_size(self.size), self.source, rows,
                f"stale: {self.stale}" if self.stale else self.status]


def remote_stores(root: StoreRoot, source: str | None = None, store: str | None = None,
                  stale_after_s: float = STALE_AFTER_S) -> list[RemoteStore]:
    """Every store folder under a remote root (only ``source``'s, or the one named ``store``, when given).

    A store that is not committed is stale only when its tasks showed no sign of life for
    ``stale_after_s`` seconds (:mod:`lightning_tune_data.cache.task_lease`).

    Args:
        root: The remote cache root.
        source: A source name to keep.
        store: A store's name, as ``cache list`` prints it.
        stale_after_s: How long a store that is not committed may show no sign of life.
    """
    stores = []
    for name in store_folders(root):
        if store is not None and name != store:
            continue
        files = StoreFiles(root, name)
        content = files.read_json(COMPLETE_MARKER)
        inputs = (content or {}).get("inputs") or {}
        label = inputs.get("source_name") or inputs.get("source_key") or name.rsplit("-", 1)[0]
        if source is not None and label != source:
            continue
        size = int(root.call(files.url(), lambda: files.fs.du(files.path())))
        status = "committed"
        if marker_matches(content):
            stale = None if content.get("package_version") == __version__ else (
                f"built by version {content.get('package_version')}, this is {__version__}")
            rows = (content.get("store") or {}).get("rows")
        else:
            status, dead = uncommitted_status(files, stale_after_s)
            stale, rows = (status if dead else None), None
        stores.append(RemoteStore(files, label, size, rows, stale, status))
    return stores


def store_details(content: dict[str, Any] | None, url: str) -> str:
    """The second ``cache list`` line of a committed store: its URL (what a training job's
    ``cache_dir`` points at), shards, largest shard, tokenizer, and the ``cache_budget`` it needs.

    Args:
        content: The store's commit (``None``: only the URL).
        url: Where the store is.
    """
    if not content:
        return f"    {url}"
    files = content.get("files") or {}
    sizes = [int(files[shard["path"]]["size"]) for shard in (content.get("store") or {}).get("shards") or []
             if shard.get("path") in files]
    tokenizer = ((content.get("inputs") or {}).get("parts") or {}).get("tokenizer") or "?"
    if not sizes:
        return f"    {url}  tokenizer {tokenizer}"
    largest, total = max(sizes), sum(sizes)
    return (f"    {url}  {len(sizes)} shards, largest {human_size(largest)}, tokenizer {tokenizer}; cache_budget: "
            f"{human_size(total)} copies it whole, at least {human_size(WINDOWS_KEPT * largest)} reads it shard by shard")


def list_remote(root: StoreRoot, source: str | None, store: str | None = None,
                stale_after_s: float = STALE_AFTER_S) -> int:
    """Print the stores under a remote root; returns 0."""
    stores = remote_stores(root, source, store, stale_after_s)
    if not stores:
        print(f"No stores in {root.url}.")
        return 0
    header = ["STORE", "SIZE", "SOURCE", "ROWS", "STATUS"]
    rows = [header, *[s.row() for s in stores]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows]
    print(lines[0])
    for line, found in zip(lines[1:], stores):
        print(line)
        committed = found.files.read_json(COMPLETE_MARKER) if found.status == "committed" else None
        print(store_details(committed, found.files.url()))
    stale = [s for s in stores if s.stale]
    hint = f": 'lightning-tune-data cache clean --cache-dir {root.url}' removes them" if stale else ""
    print(f"\n{len(stores)} stores, {human_size(sum(s.size for s in stores))} in {root.url}; {len(stale)} stale{hint}.")
    return 0


def clean_remote(root: StoreRoot, source: str | None, everything: bool, dry_run: bool, store: str | None = None,
                 stale_after_s: float = STALE_AFTER_S) -> int:
    """Remove the stale (``everything``: all; ``store``: that one, whatever its state) stores under
    a remote root; returns 0, or 1 when ``store`` names no store."""
    stores = remote_stores(root, source, store, stale_after_s)
    if store is not None and not stores:
        print(f"No store {store} in {root.url} (lightning-tune-data cache list shows the names).")
        return 1
    doomed = stores if everything or store is not None else [s for s in stores if s.stale]
    verb = "Would remove" if dry_run else "Removed"
    for store in doomed:
        if not dry_run:
            store.files.remove()
        print(f"{verb} {store.files.url()} ({human_size(store.size)}, {store.source}"
              f"{', ' + store.stale if store.stale else ''})")
    print(f"{verb} {len(doomed)} of {len(stores)} stores in {root.url}.")
    return 0


def _remote_checksum(files: StoreFiles, relative: str) -> str:
    files.fs.invalidate_cache(files.path(relative))  # read what is stored now, not a remembered version
    digest = xxhash.xxh3_128()
    with files.root.call(files.url(relative), lambda: files.fs.open(files.path(relative), "rb")) as handle:
        while chunk := handle.read(READ_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _verify_remote(files: StoreFiles, content: dict[str, Any]) -> str | None:
    for relative, expected in sorted((content.get("files") or {}).items()):
        size = files.size(relative)
        if size != expected.get("size"):
            return f"{files.url(relative)} has {size} bytes, {expected.get('size')} were written"
        got = _remote_checksum(files, relative)
        if got != expected.get(CHECKSUM_ALGORITHM):
            return (f"{files.url(relative)} does not match the checksum recorded when it was written "
                    f"({CHECKSUM_ALGORITHM} {got} != {expected.get(CHECKSUM_ALGORITHM)})")
    return None


def verify_root(args: argparse.Namespace) -> int:
    """``cache verify``: re-hash every committed store under ``args.cache_dir``.

    Returns:
        0 when every store is intact, 1 when one is corrupt (each problem printed).
    """
    root = StoreRoot(args.cache_dir, args.storage_options)
    checked, bad = 0, 0
    if root.is_remote:
        targets = [(s.files.url(), s.files) for s in remote_stores(root, args.source, getattr(args, "store", None))
                   if s.stale is None and s.status == "committed"]
    else:
        folder = root.local_path().expanduser()
        targets = [(str(p), p) for p in sorted(folder.iterdir()) if p.is_dir() and read_cache_metadata(p)] \
            if folder.is_dir() else []
    for label, target in targets:
        if isinstance(target, Path):
            content = read_cache_metadata(target) or {}
            inputs = content.get("inputs") or {}
            if args.source is not None and inputs.get("source_name") != args.source:
                continue
            problem = verify_files(target, content.get("files") or {}, "full")
        else:
            problem = _verify_remote(target, target.read_json(COMPLETE_MARKER) or {})
        checked += 1
        bad += problem is not None
        print(f"{label}: {'CORRUPT: ' + problem if problem else 'ok'}")
    print(f"Verified {checked} stores in {root.url}: {bad} corrupt.")
    return 1 if bad else 0
