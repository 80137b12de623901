"""Where a tokenized corpus's files are: a local path, a glob, or an fsspec URL.

:class:`CorpusFiles` is the one place a corpus reader touches storage. It lists what a path
matches (with each file's size and identity: an ETag for object stores, else the modification
time), reads small files and byte ranges (headers, index files), and gives a local path for a
file to memory-map. A local file is used in place. A remote file is copied whole, once per node,
into ``<local_cache_dir>/tokenized/``, named by its URL and identity (a changed remote file is
fetched again under a new name, never mixed with an old copy), written to a temporary name and
renamed, so a killed copy is never used. Every copy is checked against the size and identity the
listing recorded (small files on S3 with a GET conditional on that ETag, see
:mod:`lightning_tune_data.formats.remote_reads`): a file replaced since the corpus was opened is
named, never copied as other bytes than the run recorded. A remote corpus larger than its share of the node's
``cache_budget`` is not copied at all (:attr:`CorpusFiles.ranged`): its token files are read by
byte ranges through the node's shard cache (:mod:`lightning_tune_data.formats.ranged`), and what
opening needs of them (headers, a delimiter scan) is read with ranged requests.
"""

from __future__ import annotations

import glob
import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from lightning_tune_data.formats.remote_reads import ChangedFile, pooled_options, read_checked
from lightning_tune_data.managers.errors import DataSourceError

__all__ = ["CorpusFiles", "LOCAL_COPIES_FOLDER", "RemoteTokens", "STABLE_COPY_FIX", "stamp_of", "stat_identity"]

#: What to do about a corpus file that changes under a run, said by every error that finds one.
STABLE_COPY_FIX = "train from a copy that does not change (a pinned copy or version)"

#: Folder of this node's copies of remote corpus files, under the local cache folder.
LOCAL_COPIES_FOLDER = "tokenized"

_GLOB_CHARACTERS = "*?["
#: Up to this many copied files are checked one by one after copying; more, with one listing.
_INFO_CHECKS = 8


def stamp_of(info: dict[str, Any]) -> str:
    """A remote file's identity from its filesystem ``info``: its ETag, else its modification time."""
    stamp = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified")
    return str(stamp).strip('"')


def stat_identity(stat: os.stat_result) -> dict[str, Any]:
    """A local file's size and identity (its modification time in nanoseconds), from its ``stat``."""
    return {"size": stat.st_size, "stamp": str(stat.st_mtime_ns)}


def _is_url(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def _walk(folder: str, found: dict[str, dict[str, Any]]) -> None:
    """Every file under ``folder`` with its size and modification time (one ``stat`` per file)."""
    with os.scandir(folder) as entries:
        for entry in entries:
            if entry.is_dir():
                _walk(entry.path, found)
            elif entry.is_file():
                stat = entry.stat()
                found[entry.path] = stat_identity(stat)


def _local_listing(path: str) -> dict[str, dict[str, Any]]:
    """What a local folder, glob or file matches, by absolute path."""
    found: dict[str, dict[str, Any]] = {}
    if any(char in path for char in _GLOB_CHARACTERS):
        for name in glob.glob(path, recursive=True):
            if os.path.isfile(name):
                found[os.path.abspath(name)] = stat_identity(os.stat(name))
    elif os.path.isdir(path):
        _walk(os.path.abspath(path), found)
    elif os.path.isfile(path):
        found[os.path.abspath(path)] = stat_identity(os.stat(path))
    return found


class CorpusFiles:
    """A corpus location and how to read its files.

    Args:
        path: a local path (file or folder), a glob, or an fsspec URL (``s3://bucket/corpus/``).
        storage_options: options of the URL's filesystem (endpoint, credentials).
        local_dir: this node's folder for copies of remote files.
        description: names the source in errors.
        budget_share: this source's share of the node's ``cache_budget`` (``None``: no budget); a
            remote corpus larger than it is read by byte ranges instead of copied whole.
    """

    def __init__(self, path: str, storage_options: dict[str, Any] | None, local_dir: Path, description: str,
                 budget_share: int | None = None) -> None:
        path = os.fspath(path)
        self.path = path[len("file://"):] if path.startswith("file://") else path
        self.storage_options = dict(storage_options or {})
        self.local_dir = Path(local_dir)
        self.description = description
        self.remote = _is_url(self.path)
        self.budget_share = budget_share
        self._listing: dict[str, dict[str, Any]] | None = None
        self._bytes: int | None = None  # of every listed file

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_listing"] = None
        return state

    def _fs(self) -> Any:
        import fsspec

        return fsspec.core.url_to_fs(self.path, **pooled_options(self._protocol(), self.storage_options))[0]

    def _protocol(self) -> str:
        return self.path.split("://", 1)[0]

    def url(self, name: str) -> str:
        """``name`` (a listed file) as the user would write it."""
        return f"{self._protocol()}://{name}" if self.remote and "://" not in name else name

    def listing(self) -> dict[str, dict[str, Any]]:
        """Every file the path matches, sorted by name: ``{name: {"size", "stamp"}}``.

        A folder means every file under it; a glob, the files it matches.

        Raises:
            FileNotFoundError: the path matches no file (naming it and what to check).
        """
        if self._listing is not None:
            return self._listing
        found = self._remote_listing(self._fs()) if self.remote else _local_listing(self.path)
        if not found:
            raise FileNotFoundError(
                f"{self.description}: path {self.path!r} matches no file. Check the path (a folder, a glob such as "
                "'corpus/*.bin', or a URL such as 's3://bucket/corpus/') and, for a URL, storage_options."
            )
        self._listing = dict(sorted(found.items()))
        return self._listing

    def _remote_listing(self, fs: Any) -> dict[str, dict[str, Any]]:
        """What the URL matches now: one listing of the prefix (asking whether it is a folder first
        would list it twice), or of the glob."""
        base = self.path.split("://", 1)[1]
        if any(char in base for char in _GLOB_CHARACTERS):
            details = fs.glob(base, detail=True)
        else:
            details = fs.find(base, detail=True) or ({base: fs.info(base)} if fs.exists(base) else {})
        return {name: {"size": int(info["size"]), "stamp": stamp_of(info)}
                for name, info in details.items() if info.get("type", "file") == "file"}

    def check_unchanged(self, names: list[str]) -> None:
        """Fail unless remote files ``names`` still have the size and identity recorded at open
        (called after copying them: a copy holds the bytes the run recorded, never newer ones).
        A few files are asked about one by one; more, with one fresh listing.

        Raises:
            DataSourceError: naming the first changed file, what changed and what to do.
        """
        if not self.remote or not names:
            return
        if len(names) > _INFO_CHECKS:
            fs = self._fs()
            fs.invalidate_cache()
            now = self._remote_listing(fs)
        else:
            now = {name: self.identity_now(name) for name in names}
        for name in names:
            then = self.listing()[name]
            if now.get(name) != then:
                found = now.get(name)
                raise DataSourceError(
                    f"{self.description}: {self.url(name)} changed since the corpus was opened ({then['size']} bytes, "
                    f"identity {then['stamp']} then; "
                    f"{'missing' if found is None else str(found['size']) + ' bytes, identity ' + found['stamp']} now), "
                    "so this node's copy would hold other bytes than the run recorded. Restart the run so that every "
                    f"node opens the new file, or {STABLE_COPY_FIX}.")

    def identity_now(self, name: str) -> dict[str, Any] | None:
        """File ``name``'s (or its URL's) size and identity asked afresh, as :meth:`listing` records
        them; ``None`` when it is gone."""
        path = self.fs_path(name)
        try:
            if not self.remote:
                return stat_identity(os.stat(path))
            fs = self._fs()
            fs.invalidate_cache(path)
            info = fs.info(path)
        except FileNotFoundError:
            return None
        return {"size": int(info["size"]), "stamp": stamp_of(info)}

    @property
    def ranged(self) -> bool:
        """Whether the corpus is read by byte ranges under the node's budget: a remote corpus whose
        files are larger than its share of ``cache_budget`` (no file of it is copied whole)."""
        if not self.remote or self.budget_share is None:
            return False
        if self._bytes is None:
            self._bytes = sum(info["size"] for info in self.listing().values())
        return self._bytes > self.budget_share

    @property
    def budgeted(self) -> bool:
        """Whether files that must be decoded (compressed, or ids left unaligned by per-item
        headers) are decoded into the node's shard cache, under ``cache_budget``: with a budget,
        local or remote."""
        return self.budget_share is not None

    def fs_path(self, name: str) -> str:
        """``name`` (a listed file, or the URL of one) as its filesystem names it."""
        return name.split("://", 1)[1] if "://" in name else name

    def tokens(self, path: str, dtype: str, start: int, count: int) -> Any:
        """The ``count`` ids of ``dtype`` from byte ``start`` of ``path`` (what :meth:`local` gave):
        memory-mapped, or for a corpus read by ranges an array-like read with ranged requests."""
        if count == 0:
            return np.zeros(0, dtype)
        if "://" in path:
            return RemoteTokens(self, path, dtype, start, count)
        return np.memmap(path, dtype=dtype, mode="r", offset=start, shape=(count,))

    def identity(self, name: str) -> dict[str, Any]:
        """``{"url", "size", "stamp"}`` of a listed file, as listed."""
        return {"url": self.url(name), **self.listing()[name]}

    def read_bytes(self, name: str, start: int = 0, length: int | None = None) -> bytes:
        """Bytes ``[start, start + length)`` of a file (all of it from ``start`` when ``length`` is ``None``)."""
        if not self.remote:
            with open(name, "rb") as handle:
                handle.seek(start)
                return handle.read() if length is None else handle.read(length)
        fs = self._fs()
        end = None if length is None else start + length
        return fs.cat_file(name, start=start, end=end)

    def read_many(self, names: list[str]) -> dict[str, bytes]:
        """Whole files at once (index files). Remote ones are fetched once per node, concurrently
        (opening thousands of files costs about as many round trips as a few), and kept as copies
        named by their identity, which later opens read."""
        if not self.remote or not names:
            return {name: self.read_bytes(name) for name in names}
        copies = {name: self._copy_path(name) for name in names}
        missing = [name for name in names if not self._is_copied(name, copies[name])]
        found = dict(zip(missing, self._read_checked([(name, None, None) for name in missing])))
        for name in missing:
            _keep(copies[name], found[name])
        return {name: found[name] if name in found else _read(copies[name]) for name in names}

    def read_heads(self, lengths: dict[str, int]) -> dict[str, bytes]:
        """The first ``lengths[name]`` bytes of each file (headers). Remote ones are read once per
        node, concurrently (one ranged request each), and kept beside the copies of index files.

        Args:
            lengths: bytes wanted per file.
        """
        if not self.remote or not lengths:
            return {name: self.read_bytes(name, 0, length) for name, length in lengths.items()}
        kept = {name: self._copy_path(name).with_name(f"{name.rsplit('/', 1)[-1]}.head-{length}")
                for name, length in lengths.items()}
        found: dict[str, bytes] = {}
        for name, path in kept.items():
            try:
                found[name] = _read(path)
            except FileNotFoundError:
                pass
        missing = [name for name in lengths if name not in found]
        if missing:
            ends = [min(lengths[name], self.listing()[name]["size"]) for name in missing]
            heads = self._read_checked([(name, 0, end) for name, end in zip(missing, ends)])
            for name, head in zip(missing, heads):
                _keep(kept[name], head)
                found[name] = head
        return found

    def _read_checked(self, reads: list[tuple[str, int | None, int | None]]) -> list[bytes]:
        """Many small reads at once, each of the bytes recorded at open (see :func:`read_checked`)."""
        try:
            data, checked = read_checked(self._fs(), [(*read, self.listing()[read[0]]["stamp"]) for read in reads])
        except ChangedFile as changed:
            self.check_unchanged([str(changed)])  # names what changed
            raise DataSourceError(f"{self.description}: {self.url(str(changed))} changed while it was read. Restart "
                                  f"the run once it is stable, or {STABLE_COPY_FIX}.") from None
        if not checked:
            self.check_unchanged(sorted({name for name, _, _ in reads}))
        return data

    def _copy_path(self, name: str) -> Path:
        """Where this node keeps its copy of remote file ``name`` (named by its URL and identity)."""
        info = self.listing()[name]
        key = hashlib.sha256(f"{self.url(name)}\0{info['size']}\0{info['stamp']}".encode()).hexdigest()[:20]
        return Path(os.path.join(self.local_dir, LOCAL_COPIES_FOLDER, key, name.rsplit("/", 1)[-1]))

    def _is_copied(self, name: str, target: Path) -> bool:
        try:
            return os.stat(target).st_size == self.listing()[name]["size"]
        except FileNotFoundError:
            return False

    def local(self, name: str) -> str:
        """A local path of the file's bytes to memory-map: the file itself, or this node's copy
        of a remote file (copied whole on first use, checked by size after); for a corpus read
        by ranges (:attr:`ranged`), the file's URL (nothing is copied)."""
        if not self.remote:
            return name
        if self.ranged:
            return self.url(name)
        info = self.listing()[name]
        target = self._copy_path(name)
        if self._is_copied(name, target):
            return str(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
        self._fs().get_file(name, str(partial))
        try:
            self.check_unchanged([name])
            if partial.stat().st_size != info["size"]:
                raise DataSourceError(
                    f"{self.description}: copying {self.url(name)} gave {partial.stat().st_size} bytes, {info['size']} "
                    f"were listed: the file changed while it was copied. Restart the run once it is stable, or "
                    f"{STABLE_COPY_FIX}.")
        except DataSourceError:
            partial.unlink(missing_ok=True)
            raise
        os.replace(partial, target)
        return str(target)


def _keep(target: Path, data: bytes) -> None:
    """Write ``data`` to ``target`` whole or not at all (a partial file renamed into place)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}.partial")
    partial.write_bytes(data)
    os.replace(partial, target)


def _read(path: Path) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


class RemoteTokens:
    """Token ids of a remote file, read with ranged requests when sliced (nothing is kept).

    It stands where a memory map of a local file stands while a corpus is opened (a delimiter
    scan reads it block by block once per node).

    Args:
        files: the corpus's files.
        url: the file's URL.
        dtype: the ids' dtype.
        start: byte offset of the first id.
        count: ids.
    """

    def __init__(self, files: CorpusFiles, url: str, dtype: str, start: int, count: int) -> None:
        self.files, self.url, self.dtype = files, url, np.dtype(dtype)
        self.start, self.count = int(start), int(count)

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, key: slice) -> np.ndarray:
        first, stop, _ = key.indices(self.count)
        if stop <= first:
            return np.zeros(0, self.dtype)
        width = self.dtype.itemsize
        data = self.files.read_bytes(self.files.fs_path(self.url), self.start + first * width, (stop - first) * width)
        return np.frombuffer(data, dtype=self.dtype)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        values = self[0 : self.count]
        return values if dtype is None else values.astype(dtype)
