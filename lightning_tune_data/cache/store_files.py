"""The files of one store folder, on whatever filesystem its root is: read, written whole, listed.

Every write is all-or-nothing as seen by a reader: on a local filesystem a file is written under a
temporary name, fsynced and renamed; on object storage one ``PUT`` makes an object appear whole.
A reader therefore sees a file complete or not at all, never half of one.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import xxhash

from lightning_tune_data.cache.checksums import READ_CHUNK_BYTES, file_checksum
from lightning_tune_data.cache.fingerprints import json_default
from lightning_tune_data.cache.root import StorageError, StoreRoot, _short_error

__all__ = ["StoreFiles", "store_folders"]


class StoreFiles:
    """One store folder (``<root>/<name>``).

    Args:
        root: The cache root.
        name: The store folder's name (``<source key>-<fingerprint[:16]>``).
    """

    def __init__(self, root: StoreRoot, name: str) -> None:
        self.root = root
        self.name = name
        self.fs = root.filesystem() if root.is_remote else None
        #: The bytes :meth:`read_json` last read of each file (a whole-store download writes the
        #: commit it read, instead of fetching it once more).
        self.fetched: dict[str, bytes] = {}

    def path(self, relative: str = "") -> str:
        """A file's path on the root's filesystem (the folder itself for ``""``)."""
        return self.root.join(self.name, relative) if relative else self.root.join(self.name)

    def url(self, relative: str = "") -> str:
        """A file's full URL (or local path), for messages."""
        return self.root.url_of(self.path(relative))

    def _call(self, relative: str, action: Any) -> Any:
        return self.root.call(self.url(relative), action)

    def _write(self, relative: str, action: Any) -> None:
        """Run a write; a missing bucket (``FileNotFoundError`` from the filesystem) names the URL."""
        try:
            self._call(relative, action)
        except FileNotFoundError as error:
            raise StorageError(
                f"cache_dir {self.root.url}: cannot write {self.url(relative)} ({_short_error(error)}); "
                f"create the bucket (or container) first, or fix cache_dir."
            ) from None

    def exists(self, relative: str) -> bool:
        """Whether the file exists."""
        if self.fs is None:
            return os.path.exists(self.path(relative))
        return self._call(relative, lambda: self.fs.exists(self.path(relative)))

    def size(self, relative: str) -> int | None:
        """The file's size in bytes, ``None`` when it does not exist."""
        if self.fs is None:
            try:
                return os.stat(self.path(relative)).st_size
            except FileNotFoundError:
                return None
        try:
            return int(self._call(relative, lambda: self.fs.size(self.path(relative))))
        except FileNotFoundError:
            return None

    def modified(self, relative: str) -> float | None:
        """When the file was last written (seconds since the epoch), ``None`` when it does not exist."""
        if self.fs is None:
            try:
                return os.stat(self.path(relative)).st_mtime
            except FileNotFoundError:
                return None
        try:
            return self._call(relative, lambda: self.fs.modified(self.path(relative))).timestamp()
        except (FileNotFoundError, NotImplementedError):
            return None

    def checksum(self, relative: str) -> str | None:
        """The ``xxh3_128`` of the file's bytes as they are stored now (read whole, in chunks);
        ``None`` when it does not exist."""
        if self.fs is None:
            try:
                return file_checksum(self.path(relative))
            except FileNotFoundError:
                return None
        digest = xxhash.xxh3_128()
        self.fs.invalidate_cache(self.path(relative))  # what is stored now, not a remembered listing
        try:
            with self._call(relative, lambda: self.fs.open(self.path(relative), "rb")) as handle:
                while chunk := handle.read(READ_CHUNK_BYTES):
                    digest.update(chunk)
        except FileNotFoundError:
            return None
        return digest.hexdigest()

    def delete(self, relative: str) -> None:
        """Delete one file (nothing when it does not exist)."""
        try:
            if self.fs is None:
                os.unlink(self.path(relative))
            else:
                self._call(relative, lambda: self.fs.rm_file(self.path(relative)))
        except FileNotFoundError:
            pass

    def read_json(self, relative: str) -> Any:
        """The JSON content of a file; ``None`` when it is missing or not valid JSON."""
        try:
            if self.fs is None:
                with open(self.path(relative), encoding="utf-8") as handle:
                    return json.load(handle)
            data = self._call(relative, lambda: self.fs.cat_file(self.path(relative)))
            self.fetched[relative] = data
            return json.loads(data)
        except (FileNotFoundError, ValueError):
            return None

    def read_bytes(self, relative: str) -> bytes | None:
        """A file's bytes; ``None`` when it is missing."""
        try:
            if self.fs is None:
                return Path(self.path(relative)).read_bytes()
            return self._call(relative, lambda: self.fs.cat_file(self.path(relative)))
        except FileNotFoundError:
            return None

    def write_bytes(self, relative: str, data: bytes) -> None:
        """Write a file whole (temporary name + rename locally, one PUT remotely)."""
        if self.fs is None:
            target = Path(self.path(relative))
            target.parent.mkdir(parents=True, exist_ok=True)
            temp = target.with_name(f".{target.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
            with open(temp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, target)
            return
        self._write(relative, lambda: self.fs.pipe_file(self.path(relative), data))

    def write_json(self, relative: str, content: Any) -> bytes:
        """Write ``content`` as canonical JSON (sorted keys, so equal content is equal bytes).

        Returns:
            The bytes written.
        """
        data = json.dumps(content, sort_keys=True, indent=2, default=json_default).encode("utf-8")
        self.write_bytes(relative, data)
        return data

    def put(self, local: Path, relative: str, move: bool = False) -> None:
        """Copy a local file into the store (whole, as :meth:`write_bytes`).

        Args:
            local: The file.
            relative: Its path in the store.
            move: On a local root, move the file instead of copying it when both are on one
                filesystem (the file was written for the store and is not needed elsewhere).
        """
        if self.fs is None:
            target = Path(self.path(relative))
            if target.resolve() == local.resolve():
                return
            target.parent.mkdir(parents=True, exist_ok=True)
            if move:
                try:
                    os.replace(local, target)
                    return
                except OSError:
                    pass  # another filesystem: copy
            temp = target.with_name(f".{target.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}")
            shutil.copyfile(local, temp)
            with open(temp, "rb") as handle:
                os.fsync(handle.fileno())
            os.replace(temp, target)
            return
        self._write(relative, lambda: self.fs.put_file(str(local), self.path(relative)))

    def get(self, relative: str, local: Path) -> None:
        """Download a file to ``local`` (its folder must exist)."""
        if self.fs is None:
            shutil.copyfile(self.path(relative), local)
            return
        self._call(relative, lambda: self.fs.get_file(self.path(relative), str(local)))

    def listing(self, relative: str) -> list[str]:
        """Names of the files directly in a sub-folder (empty when it does not exist)."""
        if self.fs is None:
            folder = Path(self.path(relative))
            return sorted(p.name for p in folder.iterdir() if p.is_file()) if folder.is_dir() else []
        try:
            self.fs.invalidate_cache(self.path(relative))
            entries = self._call(relative, lambda: self.fs.ls(self.path(relative), detail=False))
        except FileNotFoundError:
            return []
        return sorted(entry.rstrip("/").rsplit("/", 1)[-1] for entry in entries)

    def remove(self) -> None:
        """Delete the whole store folder."""
        if self.fs is None:
            shutil.rmtree(self.path(), ignore_errors=True)
            return
        try:
            self._call("", lambda: self.fs.rm(self.path(), recursive=True))
        except FileNotFoundError:
            pass


def store_folders(root: StoreRoot, pattern: str = "*") -> list[str]:
    """Names of the folders directly under a cache root (local or remote) matching ``pattern``, sorted.

    Args:
        root: The cache root.
        pattern: A shell-style pattern of the names to keep (e.g. ``"notes-*"``).
    """
    if not root.is_remote:
        base = root.local_path()
        return sorted(p.name for p in base.glob(pattern) if p.is_dir()) if base.is_dir() else []
    fs = root.filesystem()
    base = root.join()
    fs.invalidate_cache(base)  # other processes and machines write here
    try:
        entries = root.call(root.url, lambda: fs.ls(base, detail=True))
    except FileNotFoundError:
        return []
    names = (e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")
    return sorted(name for name in names if fnmatch.fnmatchcase(name, pattern))
