"""The manager base class: a source's configuration, its cache fingerprint, and the cache
lifecycle (``prepare_data`` builds the cache once per node, ``setup`` opens it on every rank).

Managers hold only configuration (no open files, no datasets), so they pickle into dataloader
workers. ``source_name`` (the dataloader/metric name, set by the datamodule) is used in messages.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import shutil
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from lightning_tune_data.cache import store as cache
from lightning_tune_data.version import __version__
from lightning_tune_data.cache.checksums import VerifyMode
from lightning_tune_data.cache.records import check_token_ids, find_cache, rebuild_reason
from lightning_tune_data.managers.config import (
    CACHE_MANIFEST,
    CacheMissingError,
    DataSourceError,
    _safe_name,
    _validate_stages,
)
from lightning_tune_data.managers.input_files import InputFileChecks
from lightning_tune_data.managers.preprocessing import PreprocessingSteps
from lightning_tune_data.preprocess import PreprocessError, resolve_callable
from lightning_tune_data.tokenizers import Tokenizer


#: Defaults of ``stream_retries`` (network retries of a streaming source).
STREAM_RETRY_DEFAULTS = {"max_retries": 3, "retry_backoff_s": 1.0, "retry_timeout_s": 300.0, "read_timeout_s": 60.0}


def _validate_stream_retries(value: Mapping[str, Any] | None, desc: str) -> dict[str, float]:
    if value is None:
        return dict(STREAM_RETRY_DEFAULTS)
    unknown = sorted(set(value) - set(STREAM_RETRY_DEFAULTS)) if isinstance(value, Mapping) else None
    if unknown is None or unknown:
        raise DataSourceError(
            f"{desc}: stream_retries must be a mapping with keys among {sorted(STREAM_RETRY_DEFAULTS)}, got "
            f"{value!r}."
        )
    merged = {**STREAM_RETRY_DEFAULTS, **value}
    for key, number in merged.items():
        if isinstance(number, bool) or not isinstance(number, (int, float)) or number < 0:
            raise DataSourceError(f"{desc}: stream_retries.{key} must be a number >= 0, got {number!r}.")
    merged["max_retries"] = int(merged["max_retries"])
    return merged
@contextlib.contextmanager
def _progress_bars_off() -> Iterator[None]:
    """Hide ``datasets``' progress bars for a step (restoring the user's setting afterwards)."""
    enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if enabled:
            datasets.enable_progress_bars()


class SourceManager(InputFileChecks, PreprocessingSteps, ABC):
    """Configuration, fingerprint and cache lifecycle shared by every dataset manager.

    Subclasses set the source fields (``full_name``, ``path``, ``name``, ``split``,
    ``data_files``, ``source_name``), call :meth:`_init_common`, and implement ``_load``.
    """

    full_name: str | None
    path: str | None
    name: str | None
    split: str | None
    data_files: Any
    source_name: str | None

    def _init_common(
        self,
        weight: float,
        preprocess_function: str | Callable | None,
        preprocess_kwargs: dict | None,
        columns_to_remove: list[str] | None,
        stages: list[str] | None,
        streaming: bool,
        num_proc: int | None,
        load_kwargs: dict | None,
        shuffle: bool,
        max_error_count: int,
        transforms: dict[str, Any] | None = None,
        stream_retries: dict | None = None,
    ) -> None:
        desc = self.source_description
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not np.isfinite(weight) or weight < 0:
            raise DataSourceError(f"{desc}: weight must be a finite number >= 0, got {weight!r}.")
        if num_proc is not None and (not isinstance(num_proc, int) or num_proc < 1):
            raise DataSourceError(f"{desc}: num_proc must be None or >= 1, got {num_proc!r}.")
        if not isinstance(max_error_count, int) or max_error_count < 0:
            raise DataSourceError(
                f"{desc}: max_error_count must be an integer >= 0, got {max_error_count!r}."
            )
        for field, value in (("preprocess_kwargs", preprocess_kwargs), ("load_kwargs", load_kwargs)):
            if value is not None and not isinstance(value, Mapping):
                raise DataSourceError(f"{desc}: {field} must be a mapping, got {value!r}.")
        self.stream_retries = _validate_stream_retries(stream_retries, desc)
        self.weight = float(weight)
        self.stages = _validate_stages(stages, desc)
        self.streaming = bool(streaming)
        self.num_proc = num_proc
        self.load_kwargs = dict(load_kwargs or {})
        taken = {"path": "path", "name": "name", "split": "split", "streaming": "streaming",
                 "data_files": "data_files"}
        clashes = sorted(key for key in self.load_kwargs if key in taken)
        if clashes:
            raise DataSourceError(
                f"{desc}: load_kwargs {clashes} repeat arguments the manager passes to "
                f"datasets.load_dataset itself. Set them as the manager's own options "
                f"({', '.join(taken[k] for k in clashes)}) and remove them from load_kwargs."
            )
        self.shuffle = bool(shuffle)
        self.max_error_count = max_error_count
        self.transforms = {k: v for k, v in (transforms or {}).items() if v is not None}
        for field in ("message_transform", "model_transform", "output_transform", "filter_fn"):
            if field in self.transforms:
                resolve_callable(self.transforms[field], f"{desc}: {field}")  # fail early on a bad path
        self.columns_to_remove = list(columns_to_remove) if columns_to_remove is not None else None
        self.preprocess_kwargs = dict(preprocess_kwargs or {})
        # Keep the spec (a string pickles by value; the function is re-imported where needed).
        self.preprocess_function = preprocess_function
        if preprocess_function is not None:
            fn = self.preprocess_fn
            self._check_preprocess_kwargs(fn)
        elif self.preprocess_kwargs:
            raise DataSourceError(
                f"{desc}: preprocess_kwargs {self.preprocess_kwargs} given but "
                f"preprocess_function is None."
            )

    def stream_options(self) -> dict[str, float]:
        """Retry bounds a streaming source reads with (``HFStreamingSource`` keyword arguments)."""
        return {k: v for k, v in self.stream_retries.items() if k != "read_timeout_s"}

    def _stream_storage_options(self) -> dict[str, Any]:
        """``load_dataset`` storage options: a remote read waiting longer than ``read_timeout_s``
        fails (and is retried by the source) instead of hanging."""
        import aiohttp

        seconds = self.stream_retries["read_timeout_s"]
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=seconds, sock_read=seconds)
        return {protocol: {"client_kwargs": {"timeout": timeout}} for protocol in ("http", "https")}

    # ------------------------------------------------------------------ description / identity

    def _source_label(self) -> str:
        if self.full_name is not None:
            return f"full_name={self.full_name!r}"
        label = f"path={self.path!r}"
        if self.name is not None:
            label += f", name={self.name!r}"
        label += f", split={self.split!r}"
        if self.data_files is not None:
            label += f", data_files={self.data_files!r}"
        return label

    @property
    def source_description(self) -> str:
        """``source '<name>' (<spec>)`` for messages; the name is set by the datamodule."""
        label = self._source_label()
        return f"source '{self.source_name}' ({label})" if self.source_name else f"source {label}"

    def _cache_stem(self) -> str:
        return _safe_name("-".join(str(p) for p in (self.path, self.name, self.split) if p))

    @property
    def preprocess_fn(self) -> Callable | None:
        """The resolved preprocessing function (``None`` when the data is pre-tokenized)."""
        if self.preprocess_function is None:
            return None
        try:
            return resolve_callable(self.preprocess_function, "preprocess_function")
        except ValueError as error:
            raise DataSourceError(f"{self.source_description}: {error}") from error

    def _preprocess_label(self) -> str:
        spec = self.preprocess_function
        if isinstance(spec, str):
            return f"'{spec}'"
        return f"'{getattr(spec, '__module__', '?')}.{getattr(spec, '__qualname__', repr(spec))}'"

    def _check_preprocess_kwargs(self, fn: Callable) -> None:
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            return
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return
        positional = list(params)[:2]  # (examples, tokenizer)
        accepted = [n for n in params if n not in positional]
        unknown = [k for k in self.preprocess_kwargs if k not in accepted]
        if unknown:
            raise DataSourceError(
                f"{self.source_description}: preprocess_kwargs {unknown} are not parameters of "
                f"preprocess_function {self._preprocess_label()}; it accepts {accepted}."
            )

    def _file_identity(self, path: str) -> dict[str, Any]:
        """Content identity of a data file; hashes are remembered in the cache root, if known."""
        return cache.file_identity(path, memo_dir=getattr(self, "_hash_memo_dir", None))

    def _data_file_identities(self) -> list[dict[str, Any]]:
        return [self._file_identity(f) for f in self._local_data_files()]

    def _fingerprint_parts(self, tokenizer: Tokenizer, cache_dir: str | Path | None = None) -> dict[str, Any]:
        fn = self.preprocess_fn
        self._hash_memo_dir = cache_dir
        try:
            source = self._source_spec()
        finally:
            self._hash_memo_dir = None
        return {
            "manager": type(self).__name__,
            "source": source,
            "preprocess": {
                "function": cache.callable_identity(fn) if fn is not None else None,
                "kwargs": self.preprocess_kwargs,
                "columns_to_remove": self.columns_to_remove,
                "max_error_count": self.max_error_count,
            },
            "tokenizer": tokenizer.identity,
        }

    def fingerprint(self, tokenizer: Tokenizer, cache_dir: str | Path | None = None) -> str:
        """Hash of everything that changes the preprocessed content of this source.

        Data files count by their content (not their modification time).

        Args:
            tokenizer: The tokenizer whose ``identity`` is part of the key.
            cache_dir: The cache root, where content hashes of data files are remembered.
        """
        return cache.fingerprint(self._fingerprint_parts(tokenizer, cache_dir))

    def _cache_name(self) -> str:
        """Folder-name prefix of this source's caches: the source name, else the data's name."""
        return _safe_name(self.source_name) if self.source_name else self._cache_stem()

    def _locate_cache(self, fingerprint: str, cache_dir: str | Path) -> Path:
        found = find_cache(cache_dir, fingerprint, self._cache_metadata(fingerprint))
        return found if found is not None else Path(cache_dir) / f"{self._cache_name()}-{fingerprint[:16]}"

    def cache_dir_for(self, tokenizer: Tokenizer, cache_dir: str | Path) -> Path:
        """Directory of this source's cache: ``cache_dir/<source name>-<fingerprint[:16]>``.

        A complete cache with the same fingerprint under another name (e.g. built before the
        source was renamed) is used instead of building a second one.

        Args:
            tokenizer: The tokenizer (part of the fingerprint).
            cache_dir: The root cache directory.
        """
        return self._locate_cache(self.fingerprint(tokenizer, cache_dir), cache_dir)

    @abstractmethod
    def _load(self, cache_dir: str | Path, streaming: bool) -> datasets.Dataset | datasets.IterableDataset:
        """Load the raw source (``streaming``: as a ``datasets.IterableDataset``)."""

    # ---------------------------------------------------------------------------- lifecycle

    def _cache_metadata(self, fingerprint: str) -> dict[str, Any]:
        return {"fingerprint": fingerprint, "manager": type(self).__name__}

    def prepare_data(
        self, tokenizer: Tokenizer, cache_dir: str | Path, cache_verify: VerifyMode = "checksum"
    ) -> Path | None:
        """Download, preprocess and cache this source (once per node); reuse a valid cache.

        A reused cache is checked first: with ``cache_verify="checksum"`` every file is hashed
        and compared with the checksum recorded when it was written (a corrupt cache is rebuilt
        with a warning naming the file); ``"size"`` compares file sizes only. Reuse needs no
        write access; a build in a directory that cannot be written fails naming it.

        Args:
            tokenizer: Tokenizer passed to the preprocess function (and keyed into the cache).
            cache_dir: Root cache directory; ``datasets``' own download cache lives inside it.
            cache_verify: ``"checksum"`` (default) or ``"size"``.

        Returns:
            The cache directory, or ``None`` for streaming sources (nothing is cached).
        """
        if self.streaming:
            return None
        parts = self._fingerprint_parts(tokenizer, cache_dir)
        fingerprint = cache.fingerprint(parts)
        final_dir = self._locate_cache(fingerprint, cache_dir)
        inputs = {"source_key": self._cache_name(), "source_name": self.source_name,
                  "package_version": __version__, "parts": parts}

        def build(temp_dir: Path) -> None:
            for path in self._local_data_files():
                if os.path.getsize(path) == 0:
                    warnings.warn(f"{self.source_description}: data file {path} is empty; it adds no rows.",
                                  stacklevel=2)
            with _progress_bars_off():  # one bar per source: the tokenization's
                dataset = self._load(cache_dir, streaming=False)
            work_dir = temp_dir / "_work"
            self._skipped_rows = 0
            processed = self._preprocess(dataset, tokenizer, work_dir, fingerprint)
            check_token_ids(processed, tokenizer.vocab_size, tokenizer, self.source_description)
            num_rows = len(processed)
            if num_rows == 0:  # (datasets cannot even reopen a saved 0-row dataset)
                raise PreprocessError(
                    f"{self.source_description}: no rows left after preprocessing ({len(dataset)} rows read, "
                    f"{self._skipped_rows} skipped as failed). Check the data files and what "
                    f"preprocess_function {self._preprocess_label()} filters out."
                )
            with _progress_bars_off():
                processed.save_to_disk(str(temp_dir / "dataset"))
            del processed, dataset
            shutil.rmtree(work_dir, ignore_errors=True)
            files = {
                p.relative_to(temp_dir).as_posix(): p.stat().st_size
                for p in sorted((temp_dir / "dataset").rglob("*")) if p.is_file()
            }
            manifest = {"num_rows": num_rows, "skipped_rows": self._skipped_rows, "files": files}
            (temp_dir / CACHE_MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))

        return cache.build_cache_atomically(
            final_dir, build, self._cache_metadata(fingerprint), verify=lambda d: self._open_cache(d)[1],
            verify_mode=cache_verify, inputs=inputs, description=self.source_description,
            build_reason=lambda: rebuild_reason(cache_dir, inputs, final_dir),
        )

    def _open_cache(self, final_dir: Path) -> tuple[datasets.Dataset | None, str | None]:
        """Open a finished cache and check it against its manifest: ``(dataset, None)`` or
        ``(None, what is wrong)``. Catches truncated, missing or unreadable files and a changed
        row count; bit flips that keep every size are caught by the checksums that
        ``prepare_data`` verifies (not here: ``setup`` runs on every rank)."""
        manifest: dict[str, Any] | None = None
        try:
            manifest = json.loads((final_dir / CACHE_MANIFEST).read_text())
        except FileNotFoundError:
            pass  # written by an older version: only the opening check below applies
        except (OSError, ValueError) as error:
            return None, f"{CACHE_MANIFEST} is unreadable ({error})"
        for relative, size in (manifest or {}).get("files", {}).items():
            path = final_dir / relative
            if not path.is_file():
                return None, f"{relative} is missing"
            if path.stat().st_size != size:
                actual = path.stat().st_size
                return None, f"{relative} has {actual} bytes, {size} were written (truncated or overwritten)"
        try:
            dataset = datasets.Dataset.load_from_disk(str(final_dir / "dataset"))
        except Exception as error:  # noqa: BLE001 - any failure to open means a corrupt cache
            return None, f"the dataset does not open ({type(error).__name__}: {error})"
        if manifest is not None and len(dataset) != manifest.get("num_rows"):
            return None, f"it holds {len(dataset)} rows, {manifest.get('num_rows')} were written"
        return dataset, None

    def setup(
        self, tokenizer: Tokenizer, cache_dir: str | Path
    ) -> datasets.Dataset | datasets.IterableDataset:
        """Load this source on the current rank.

        Args:
            tokenizer: The tokenizer used by ``prepare_data`` (its identity selects the cache).
            cache_dir: Root cache directory given to ``prepare_data``.

        Returns:
            The memory-mapped cached ``datasets.Dataset`` (columns ``input_ids`` [+ ``loss_mask``]),
            or for ``streaming=True`` a ``datasets.IterableDataset`` tokenized lazily.

        Raises:
            CacheMissingError: No valid cache for this configuration: run ``prepare_data`` first.
        """
        if self.streaming:
            return self._setup_streaming(tokenizer, cache_dir)
        fingerprint = self.fingerprint(tokenizer, cache_dir)
        final_dir = self._locate_cache(fingerprint, cache_dir)
        if not cache.is_valid_cache(final_dir, self._cache_metadata(fingerprint)):
            others = sorted(
                p.name
                for p in Path(cache_dir).glob(f"{self._cache_name()}-*")
                if p.is_dir() and cache.is_valid_cache(p)
            )
            hint = (
                f" Caches of other configurations of this source exist ({others}); the tokenizer, "
                f"preprocessing, data files or package version differ from when they were built."
                if others
                else ""
            )
            raise CacheMissingError(
                f"{self.source_description}: no valid preprocessed cache at {final_dir}. Run "
                f"prepare_data first (TextDataModule.prepare_data / the Trainer does this on local "
                f"rank 0 before setup) with the same tokenizer and cache_dir.{hint}"
            )
        dataset, problem = self._open_cache(final_dir)
        if problem is not None:
            raise CacheMissingError(
                f"{self.source_description}: the preprocessed cache at {final_dir} is corrupt "
                f"({problem}). Run prepare_data again: it removes the corrupt cache with a warning "
                f"and rebuilds it."
            )
        return dataset

    def stream_transforms(self) -> dict[str, Any]:
        """Per-sample transforms and filter for this source's train stream.

        They run on each document sample (``input_ids``, ``loss_mask``, ``source``, ``epoch``)
        as it is streamed, after the cached preprocessing; failures count against
        ``max_error_count``.
        """
        resolved = {
            field: resolve_callable(spec, f"{self.source_description}: {field}")
            for field, spec in self.transforms.items()
            if field != "filter_kwargs"
        }
        if "filter_kwargs" in self.transforms:
            resolved["filter_kwargs"] = dict(self.transforms["filter_kwargs"])
        return resolved

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._source_label()}, weight={self.weight}, stages={self.stages})"
