"""``lightning-tune-data cache list|clean|verify``: what the preprocessed-data cache holds, and tidying it.

``list`` shows one line per cache folder: its size, the source it was built for and the data it
was built from (which tells apart two sources of the same name in different splits, e.g. a train
and a val ``arithmetic``), when, and whether it is stale. ``clean`` removes the stale ones (``--all``: every cache; ``--dry-run``:
only say what would go). A cache is **stale** when it can never be used again as it is:

* its data files changed or disappeared since it was built (their content differs now);
* it was written by another version of this package (the version is part of every key);
* it is incomplete: a build that was interrupted (a folder without a completion marker, or a
  leftover temporary folder) or a lock file with no cache;
* it is ``hf_datasets``: the ``datasets`` library's Arrow conversions of data files (and
  downloads), read only while a cache is being built; removing it costs a re-conversion (or a
  re-download) at the next build, never a finished cache.

A node's shard cache of a remote store read through ``cache_budget`` (``shard-cache/<store>``) is
listed per store and never stale: evicting keeps it within its budget; ``clean --all`` removes it.

Caches of the same source built with another tokenizer or preprocessing are *not* stale: a
config using those settings reuses them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from lightning_tune_data.cache.checksums import FILE_HASH_MEMO
from lightning_tune_data.cache.layout import DOWNLOAD_FOLDER, is_orphan_lock, is_temporary_folder, lock_path
from lightning_tune_data.cache.marker import COMPLETE_MARKER, read_cache_metadata
from lightning_tune_data.cache.node_cache import NODE_CACHE_FOLDER
from lightning_tune_data.cache.records import changed_data_file
from lightning_tune_data.cache.sizes import human_size, tree_size
from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.cache.store_files import StoreFiles
from lightning_tune_data.cache.task_lease import STALE_AFTER_S, uncommitted_status
from lightning_tune_data.cache.tasks import TASK_FOLDER
from lightning_tune_data.commands.cache_stores import clean_remote, list_remote, store_details, verify_root
from lightning_tune_data.version import __version__

__all__ = ["CacheEntry", "main", "scan"]


@dataclass
class CacheEntry:
    """One thing in the cache root: a cache folder, an unfinished build or an orphan lock."""

    path: Path
    size: int
    source: str
    built: float | None
    stale: str | None  # why it is stale; None when it is usable
    data: str = "-"  # what it was built from, e.g. "json data_files=['arithmetic_val.jsonl']"
    status: str = "ok"  # what a usable entry is (e.g. "being written: task 2 running; ...")

    def row(self) -> list[str]:
        """The entry's cells in the ``cache list`` table: name, size, source, data, build time, status."""
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.built)) if self.built else "-"
        return [self.path.name, human_size(self.size), self.source, self.data, when,
                f"stale: {self.stale}" if self.stale else self.status]


def _built_from(description: str | None) -> str:
    """The data part of a cache's description: ``source 'x' (json data_files=[...])`` -> ``json data_files=[...]``."""
    if not description:
        return "-"
    match = re.fullmatch(r"source (?:'[^']*' )?\((.*)\)", description, flags=re.S)
    return match.group(1) if match else description


def _describe(path: Path, root: Path, stale_after_s: float = STALE_AFTER_S) -> CacheEntry:
    size = tree_size(path)
    content = read_cache_metadata(path)
    if content is None:
        marker = path / COMPLETE_MARKER
        if not marker.is_file() and (path / TASK_FOLDER).is_dir():  # written by prepare's tasks: alive?
            status, dead = uncommitted_status(StoreFiles(StoreRoot(str(root)), path.name), stale_after_s)
            return CacheEntry(path, size, path.name.rsplit("-", 1)[0], path.stat().st_mtime, status if dead else None,
                              status=status)
        why = "written by another version of the package" if marker.is_file() else "unfinished build (no completion marker)"
        return CacheEntry(path, size, "?", path.stat().st_mtime, why)
    inputs = content.get("inputs") or {}
    source = inputs.get("source_name") or inputs.get("source_key") or content.get("description") or "?"
    built = (path / COMPLETE_MARKER).stat().st_mtime
    stale = None
    if content.get("package_version") != __version__:
        stale = f"built by version {content.get('package_version')}, this is {__version__}"
    else:
        stale = changed_data_file(inputs.get("parts") or {}, root)
    return CacheEntry(path, size, source, built, stale, _built_from(content.get("description")))


def scan(root: str | os.PathLike[str], stale_after_s: float = STALE_AFTER_S) -> list[CacheEntry]:
    """Every cache, unfinished build and orphan lock file directly under ``root``.

    Args:
        root: The cache root (a missing one holds nothing).
        stale_after_s: How long a store being written by tasks may show no sign of life before
            it is stale.
    """
    root = Path(root)
    entries: list[CacheEntry] = []
    if not root.is_dir():
        return entries
    for path in sorted(root.iterdir()):
        if path.name == FILE_HASH_MEMO:
            continue
        if path.name == DOWNLOAD_FOLDER and path.is_dir():
            entries.append(CacheEntry(path, tree_size(path), "(datasets library)", path.stat().st_mtime,
                                      "intermediate files of the datasets library, only read while building"))
            continue
        if path.name == NODE_CACHE_FOLDER and path.is_dir():
            entries += [CacheEntry(store, tree_size(store), "(node shard cache)", store.stat().st_mtime, None,
                                   f"shards of {store.name}, within cache_budget") for store in sorted(path.iterdir())
                        if store.is_dir() and not store.name.startswith(".")]  # not the node's room lock
            continue
        if is_temporary_folder(path):
            entries.append(CacheEntry(path, tree_size(path), "?", path.stat().st_mtime,
                                      "leftover temporary folder of an interrupted build"))
        elif path.is_dir() and not path.name.startswith("."):
            entries.append(_describe(path, root, stale_after_s))
        elif is_orphan_lock(path):
            entries.append(CacheEntry(path, 0, "?", path.stat().st_mtime, "lock file without a cache"))
    return entries


def _table(rows: list[list[str]]) -> str:
    header = ["CACHE", "SIZE", "SOURCE", "DATA", "BUILT", "STATUS"]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip() for r in [header, *rows]]
    return "\n".join(lines)


def _summary(entries: list[CacheEntry], root: Path) -> str:
    """The line under the ``cache list`` table: totals, and how to remove the stale entries if any."""
    stale = [e for e in entries if e.stale]
    line = f"{len(entries)} entries, {human_size(sum(e.size for e in entries))} in {root}; "
    if not stale:
        return line + "nothing stale."
    return line + (f"{len(stale)} stale ({human_size(sum(e.size for e in stale))}): "
                   f"'lightning-tune-data cache clean --cache_dir {root}' removes them.")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    lock = lock_path(path)
    if lock.exists():
        lock.unlink()


def _parser() -> argparse.ArgumentParser:
    from lightning_tune_data.datamodule.module import default_cache_dir

    parser = argparse.ArgumentParser(prog="lightning-tune-data cache", description=__doc__.split("\n\n")[0])
    actions = parser.add_subparsers(dest="action", required=True)
    for name, text in (("list", "show caches: size, source, data, build time, stale or ok"),
                       ("clean", "remove stale caches (or all with --all)"),
                       ("verify", "re-hash every file of every cache and compare with its recorded checksum")):
        sub = actions.add_parser(name, help=text)
        sub.add_argument("--config", default=None,
                         help="a fit YAML config: its data.cache_dir and data.storage_options are the defaults")
        sub.add_argument("--cache_dir", "--cache-dir", default=None,
                         help=f"the cache root (the data.cache_dir of your config; default: {default_cache_dir()})")
        sub.add_argument("--source", default=None, help="only caches of this source name")
        sub.add_argument("--store", default=None, help="only this store (its name as `cache list` prints it); "
                                                       "`clean --store NAME` removes it whatever its state")
        sub.add_argument("--stale-after", "--stale_after", type=float, default=STALE_AFTER_S / 3600,
                         help="hours a store that is not committed may show no sign of life (a task's heartbeat, a "
                              "finished task) before it is stale (default: %(default)g)")
        sub.add_argument("--storage-options", "--storage_options", type=json.loads, default=None,
                         help="JSON options of a remote cache root's filesystem (the data.storage_options "
                              "of your config), e.g. '{\"endpoint_url\": \"http://...\"}'")
        if name == "clean":
            sub.add_argument("--all", action="store_true", help="remove every cache, not only stale ones")
            sub.add_argument("--dry-run", "--dry_run", action="store_true", help="only print what would be removed")
    return parser


def _config_defaults(args: argparse.Namespace) -> None:
    """Fill ``--cache-dir`` and ``--storage-options`` not given on the command line from the
    ``data:`` section of ``--config``, else the default cache root."""
    from lightning_tune_data.datamodule.module import default_cache_dir

    data = {}
    if args.config is not None:
        import yaml

        data = (yaml.safe_load(Path(args.config).read_text(encoding="utf-8")) or {}).get("data") or {}
    if args.cache_dir is None:
        args.cache_dir = str(data.get("cache_dir") or default_cache_dir())
    if args.storage_options is None:
        args.storage_options = data.get("storage_options")


def main(argv: list[str]) -> int:
    """Run ``cache list`` or ``cache clean``; returns the exit code.

    Args:
        argv: The arguments after ``cache`` (``list``/``clean`` and their options).
    """
    args = _parser().parse_args(argv)
    _config_defaults(args)
    if args.action == "verify":
        return verify_root(args)
    stale_after_s = args.stale_after * 3600
    if "://" in args.cache_dir and not args.cache_dir.startswith("file://"):
        remote = StoreRoot(args.cache_dir, args.storage_options)
        if args.action == "list":
            return list_remote(remote, args.source, args.store, stale_after_s)
        return clean_remote(remote, args.source, args.all, args.dry_run, args.store, stale_after_s)
    root = Path(args.cache_dir).expanduser()
    entries = [e for e in scan(root, stale_after_s) if (args.source is None or e.source == args.source)
               and (args.store is None or e.path.name == args.store)]
    if args.store is not None and not entries:
        print(f"No store {args.store} in {root} (lightning-tune-data cache list shows the names).")
        return 1
    if args.action == "list":
        if not entries:
            print(f"No caches in {root}.")
            return 0
        table = _table([e.row() for e in entries]).splitlines()
        print(table[0])
        for line, entry in zip(table[1:], entries):
            print(line)
            content = read_cache_metadata(entry.path) if entry.path.is_dir() and not entry.stale else None
            if content:
                print(store_details(content, str(entry.path)))
        print(f"\n{_summary(entries, root)}")
        return 0
    doomed = entries if args.all or args.store is not None else [e for e in entries if e.stale]
    verb = "Would remove" if args.dry_run else "Removed"
    for entry in doomed:
        if not args.dry_run:
            try:
                _remove(entry.path)
            except OSError as error:
                print(f"Cannot remove {entry.path}: {error}", file=sys.stderr)
                return 1
        print(f"{verb} {entry.path.name} ({human_size(entry.size)}, {entry.source}"
              f"{', ' + entry.stale if entry.stale else ''})")
    freed = human_size(sum(e.size for e in doomed))
    print(f"{verb} {len(doomed)} of {len(entries)} entries ({freed}) in {root}.")
    return 0
