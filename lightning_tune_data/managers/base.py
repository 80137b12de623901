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
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import datasets
import numpy as np

from lightning_tune_data import cache
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


class SourceManager(InputFileChecks, PreprocessingSteps):
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

    def _data_file_identities(self) -> list[dict[str, Any]]:
        return [cache.file_identity(f) for f in self._local_data_files()]

    def fingerprint(self, tokenizer: Tokenizer) -> str:
        """Hash of everything that changes the preprocessed content of this source.

        Args:
            tokenizer: The tokenizer whose ``identity`` is part of the key.
        """
        fn = self.preprocess_fn
        return cache.fingerprint(
            {
                "manager": type(self).__name__,
                "source": self._source_spec(),
                "preprocess": {
                    "function": cache.callable_identity(fn) if fn is not None else None,
                    "kwargs": self.preprocess_kwargs,
                    "columns_to_remove": self.columns_to_remove,
                    "max_error_count": self.max_error_count,
                },
                "tokenizer": tokenizer.identity,
            }
        )

    def cache_dir_for(self, tokenizer: Tokenizer, cache_dir: str | Path) -> Path:
        """Directory of this source's cache: ``cache_dir/<safe source name>-<fingerprint[:16]>``.

        Args:
            tokenizer: The tokenizer (part of the fingerprint).
            cache_dir: The root cache directory.
        """
        return Path(cache_dir) / f"{self._cache_stem()}-{self.fingerprint(tokenizer)[:16]}"

    def _load(self, cache_dir: str | Path, streaming: bool) -> datasets.Dataset | datasets.IterableDataset:
        raise NotImplementedError

    # ---------------------------------------------------------------------------- lifecycle

    def _cache_metadata(self, fingerprint: str) -> dict[str, Any]:
        return {"fingerprint": fingerprint, "manager": type(self).__name__}

    def prepare_data(self, tokenizer: Tokenizer, cache_dir: str | Path) -> Path | None:
        """Download, preprocess and cache this source (once per node); reuse a valid cache.

        Args:
            tokenizer: Tokenizer passed to the preprocess function (and keyed into the cache).
            cache_dir: Root cache directory; ``datasets``' own download cache lives inside it.

        Returns:
            The cache directory, or ``None`` for streaming sources (nothing is cached).
        """
        if self.streaming:
            return None
        fingerprint = self.fingerprint(tokenizer)
        final_dir = Path(cache_dir) / f"{self._cache_stem()}-{fingerprint[:16]}"

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
            final_dir, build, self._cache_metadata(fingerprint), verify=lambda d: self._open_cache(d)[1]
        )

    def _open_cache(self, final_dir: Path) -> tuple[datasets.Dataset | None, str | None]:
        """Open a finished cache and check it against its manifest: ``(dataset, None)`` or
        ``(None, what is wrong)``. Catches truncated, missing or unreadable files and a changed
        row count (not bit flips that keep every size: the data is not checksummed)."""
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
        fingerprint = self.fingerprint(tokenizer)
        final_dir = Path(cache_dir) / f"{self._cache_stem()}-{fingerprint[:16]}"
        if not cache.is_valid_cache(final_dir, self._cache_metadata(fingerprint)):
            others = sorted(
                p.name
                for p in Path(cache_dir).glob(f"{self._cache_stem()}-*")
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
