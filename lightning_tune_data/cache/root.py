"""Where a cache root lives: a local folder, or any filesystem ``fsspec`` knows (``s3://``,
``gs://``, ``az://``, ``file://``, ...), plus the node-local folder that mirrors a remote one.

A local root is used as it always was. A remote root holds the committed stores; each node keeps
a verified copy of the stores it reads under ``local_dir`` (and ``datasets``' conversions and the
data files' hash memo, which only make sense on one machine).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

__all__ = ["BUILD_STORES", "DEFAULT_SHARD_BYTES", "BuildStores", "CacheBudgetError", "StorageError", "StoreRoot",
           "default_local_cache_dir", "parse_size"]

#: When ``prepare_data`` may build a missing store itself: ``"if_missing"`` (tokenize here),
#: ``"never"`` (fail naming the store: ``lightning-tune-data prepare`` builds it), ``"auto"``
#: (``"never"`` for a remote ``cache_dir``, where a mistyped URL would otherwise turn a training
#: node into a tokenizer for hours, ``"if_missing"`` for a local one).
BuildStores = Literal["auto", "never", "if_missing"]
BUILD_STORES: tuple[str, ...] = BuildStores.__args__

#: Shards are closed once they hold about this many bytes.
DEFAULT_SHARD_BYTES = 256 << 20
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40}
T = TypeVar("T")


class StorageError(OSError):
    """Remote storage cannot be reached or used; the message names the URL and the likely fix."""


class CacheBudgetError(ValueError):
    """A node's ``cache_budget`` cannot hold what reading a store needs; the message names the size needed."""


def default_local_cache_dir() -> Path:
    """``$LIGHTNING_TUNE_DATA_CACHE`` or ``~/.cache/lightning_tune_data``: the node-local cache."""
    env = os.environ.get("LIGHTNING_TUNE_DATA_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "lightning_tune_data"


def parse_size(value: int | str) -> int:
    """Bytes from ``268435456``, ``"256MB"``, ``"256 MiB"`` or ``"1.5GB"``.

    Args:
        value: A byte count or a number with a unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB).

    Raises:
        ValueError: Not a positive size.
    """
    if isinstance(value, int):
        number = value
    else:
        text = str(value).strip().upper().replace(" ", "")
        digits = text.rstrip("BKMGTI")
        unit = text[len(digits):]
        try:
            number = int(float(digits) * _UNITS[unit])
        except (KeyError, ValueError):
            raise ValueError(f"{value!r} is not a size; write e.g. 268435456, '256MB' or '1GiB'.") from None
    if number <= 0:
        raise ValueError(f"{value!r} is not a positive size.")
    return number


def _is_url(text: str) -> bool:
    return "://" in text and not text.startswith("file://")


def _short_error(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


@dataclass(frozen=True)
class StoreRoot:
    """A cache root and how to reach it.

    Args:
        url: A local path, or an fsspec URL such as ``s3://bucket/prefix``.
        storage_options: Passed to the filesystem (e.g. ``{"endpoint_url": ..., "profile": ...}``).
        local_dir: The node-local folder: for a local root, the root itself; for a remote one,
            where this node keeps its verified copies (default :func:`default_local_cache_dir`).
        shard_bytes: New stores close a shard once it holds about this many bytes.
        cache_budget: For a remote root, the most bytes of train stores' shards this node keeps
            in its shard cache, for every store read shard by shard on the node together; a
            store larger than its share is read shard by shard, window by window, instead of
            being copied whole. ``None``: train stores are copied whole.
        budget_sharers: How many train stores share ``cache_budget`` (each store's shuffle
            window is sized to its share).
        node_readers: How many processes of this node read each train store (local ranks
            times dataloader workers): windows are sized so that all of them fit the budget.
        shuffle_window: Rows a budgeted store's shuffle mixes at a time (``None``: derived
            from the budget when a run starts; a resume takes the checkpoint's).
        build_stores: Whether ``prepare_data`` builds a missing store (:data:`BuildStores`).
    """

    url: str
    storage_options: Mapping[str, Any] | None = None
    local_dir: Path = field(default=None)  # type: ignore[assignment]
    shard_bytes: int = DEFAULT_SHARD_BYTES
    cache_budget: int | None = None
    shuffle_window: int | None = None
    budget_sharers: int = 1
    node_readers: int = 1
    build_stores: BuildStores = "auto"

    def __post_init__(self) -> None:
        if self.build_stores not in BUILD_STORES:
            raise ValueError(f"build_stores={self.build_stores!r} is not one of {', '.join(BUILD_STORES)}.")
        url = os.fspath(self.url)
        if url.startswith("file://"):
            url = url[len("file://"):]
        object.__setattr__(self, "url", url.rstrip("/") if _is_url(url) else url)
        if self.local_dir is None:
            local = Path(url) if not _is_url(url) else default_local_cache_dir()
            object.__setattr__(self, "local_dir", local)
        else:
            object.__setattr__(self, "local_dir", Path(self.local_dir))

    @classmethod
    def configured(cls, url: str | os.PathLike[str], storage_options: Mapping[str, Any] | None, local_dir: str | None,
                   shard_size: int | str, cache_budget: int | str | None, shuffle_window: int | None,
                   build_stores: BuildStores = "auto") -> StoreRoot:
        """A root from a datamodule's options (sizes as bytes or ``"256MB"``-style text).

        Raises:
            ValueError: A size that is not one, or a ``shuffle_window`` below 1.
        """
        if shuffle_window is not None and shuffle_window < 1:
            raise ValueError(f"shuffle_window must be >= 1 row, got {shuffle_window}.")
        budget = None if cache_budget is None else parse_size(cache_budget)
        return cls(os.fspath(url), storage_options, local_dir, parse_size(shard_size), budget, shuffle_window,
                   build_stores=build_stores)

    @classmethod
    def of(cls, root: str | os.PathLike[str] | StoreRoot, **options: Any) -> StoreRoot:
        """``root`` itself, or a ``StoreRoot`` for a path/URL with ``options``.

        Args:
            root: A ``StoreRoot``, a local path or an fsspec URL.
            options: ``StoreRoot`` fields for a path/URL (ignored when ``root`` is a ``StoreRoot``).
        """
        if isinstance(root, StoreRoot):
            return root
        return cls(os.fspath(root), **{k: v for k, v in options.items() if v is not None})

    def with_url(self, url: str | os.PathLike[str] | None) -> StoreRoot:
        """This root moved to ``url`` (a source's own ``cache_dir``), keeping the storage options,
        the shard size and, for a remote ``url``, this node's local folder; ``None``: this root."""
        if url is None:
            return self
        moved = StoreRoot(os.fspath(url), self.storage_options, shard_bytes=self.shard_bytes,
                          cache_budget=self.cache_budget, shuffle_window=self.shuffle_window,
                          budget_sharers=self.budget_sharers, node_readers=self.node_readers,
                          build_stores=self.build_stores)
        if moved.is_remote and self.is_remote:
            return replace(moved, local_dir=self.local_dir)
        return moved

    def shared_by(self, stores: int) -> StoreRoot:
        """This root with its ``cache_budget`` shared by ``stores`` train stores."""
        return replace(self, budget_sharers=max(1, int(stores)))

    def read_by(self, readers: int) -> StoreRoot:
        """This root with its train stores read by ``readers`` processes of this node."""
        return replace(self, node_readers=max(1, int(readers)))

    @property
    def budget_share(self) -> int | None:
        """One train store's share of ``cache_budget`` (``None`` without a budget)."""
        return None if self.cache_budget is None else self.cache_budget // self.budget_sharers

    def unbudgeted(self) -> StoreRoot:
        """This root with whole copies of its stores (evaluation sources are read whole)."""
        return replace(self, cache_budget=None, shuffle_window=None)

    @property
    def builds_missing_stores(self) -> bool:
        """Whether ``prepare_data`` builds a store that is missing here (see :data:`BuildStores`)."""
        return self.build_stores == "if_missing" or (self.build_stores == "auto" and not self.is_remote)

    def check(self, writable: bool) -> None:
        """Fail at once, before any tokenization, when a remote root cannot be used: its bucket
        (or container) does not exist, or (``writable``) nothing can be written under it. A local
        root is checked when it is written (a read-only one is named then).

        Args:
            writable: Also write (and remove) a small probe object under the root.

        Raises:
            StorageError: Naming the URL and the fix.
        """
        if not self.is_remote:
            return
        fs = self.filesystem()
        bucket = self.join().split("/", 1)[0]
        missing = StorageError(f"cache_dir {self.url}: the bucket (or container) {bucket!r} does not exist; create it "
                               f"first, or fix cache_dir (and storage_options, e.g. endpoint_url).")
        try:
            present = self.call(self.url, lambda: fs.exists(bucket))
        except StorageError:  # credentials limited to the prefix may not ask about the bucket itself
            present = None  # then the probe decides (or, read-only, what is found under the prefix)
        if present is False:
            raise missing
        if writable:
            probe = self.join(f".write-check-{os.getpid()}-{uuid.uuid4().hex[:8]}")
            try:
                self.call(self.url, lambda: fs.pipe_file(probe, b""))
            except FileNotFoundError:
                raise missing from None
            self.call(self.url, lambda: fs.rm_file(probe))

    @property
    def is_remote(self) -> bool:
        """Whether the root is on another filesystem than this machine's."""
        return _is_url(self.url)

    def local_path(self) -> Path:
        """The root as a local path (only for a local root)."""
        assert not self.is_remote
        return Path(self.url)

    def filesystem(self) -> Any:
        """The fsspec filesystem of the root (instances are cached by fsspec)."""
        import fsspec

        try:
            fs, _ = fsspec.core.url_to_fs(self.url, **dict(self.storage_options or {}))
        except ImportError as error:
            protocol = self.url.split("://", 1)[0]
            raise StorageError(
                f"cache_dir {self.url}: no filesystem for '{protocol}://' is installed ({error}). "
                f"Install it, e.g. pip install 'lightning-tune-data[s3]' (s3fs), '[gcs]' (gcsfs) or '[azure]' (adlfs)."
            ) from None
        return fs

    def join(self, *parts: str) -> str:
        """The path of ``parts`` under the root, as the filesystem names it (no protocol)."""
        base = self.url.split("://", 1)[1] if self.is_remote else self.url
        return "/".join([base.rstrip("/"), *parts])

    def url_of(self, path: str) -> str:
        """A filesystem path under the root as a full URL, for messages."""
        if not self.is_remote:
            return path
        return f"{self.url.split('://', 1)[0]}://{path}"

    def call(self, what: str, action: Callable[[], T]) -> T:
        """Run a storage operation; turn connection and credential failures into one line.

        Args:
            what: The URL the operation is about, named in the error.
            action: The operation.

        Raises:
            StorageError: The storage is unreachable or refuses the credentials.
            FileNotFoundError: Passed through (callers decide what a missing object means).
        """
        try:
            return action()
        except FileNotFoundError:
            raise
        except StorageError:
            raise
        except Exception as error:  # noqa: BLE001 - botocore/aiohttp/... errors have no common base
            raise StorageError(_storage_message(what, self, error)) from None


def _storage_message(what: str, root: StoreRoot, error: BaseException) -> str:
    name = type(error).__name__
    text = str(error)
    if "credential" in text.lower() or name in {"NoCredentialsError", "PartialCredentialsError"}:
        fix = ("set credentials for it (environment, profile or storage_options: "
               "{key: ..., secret: ...} / {profile: ...})")
    elif isinstance(error, PermissionError) or "AccessDenied" in text or "Forbidden" in text:
        fix = "the credentials in use may not read or write there; check the bucket policy or storage_options"
    else:
        fix = ("check the URL, the network and storage_options (e.g. endpoint_url for an S3-compatible "
               "server)")
    return f"cache_dir {root.url}: cannot use {what} ({_short_error(error)}); {fix}."
