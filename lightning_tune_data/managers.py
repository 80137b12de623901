"""Dataset managers: one per source; download -> preprocess -> cache, then load on every rank.

* :class:`DatasetManager`: a Hugging Face hub dataset (``full_name`` or ``path``/``name``/``split``),
  or anything ``datasets.load_dataset`` can load.
* :class:`LocalDatasetManager`: local JSON(L)/CSV/Parquet/text files.
* :class:`UnconditionalGenerationDatasetManager`: ``num_examples`` BOS-only prompts for
  unconditional generation (predict); nothing to download or cache.

Lifecycle: ``prepare_data(tokenizer, cache_dir)`` runs once per node (Lightning calls it on local
rank 0) and writes an atomic cache keyed by a fingerprint of everything that changes its content
(see :mod:`lightning_tune_data.cache`); ``setup(tokenizer, cache_dir)`` runs on every rank and
memory-maps that cache (it never builds it). Streaming managers skip the cache and tokenize lazily.

Managers hold only configuration (no open files, no datasets), so they pickle into dataloader
workers. ``source_name`` (the dataloader/metric name, set by the datamodule) is used in messages.
"""

from __future__ import annotations

import glob
import inspect
import json
import logging
import os
import re
import shutil
import traceback
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
from torch.utils.data import Dataset as TorchDataset

from lightning_tune_data import cache
from lightning_tune_data.preprocess import (
    MissingColumnError,
    PreprocessError,
    RowError,
    resolve_callable,
)
from lightning_tune_data.tokenizers import Tokenizer

__all__ = [
    "STAGES",
    "CacheMissingError",
    "DataSourceError",
    "DatasetManager",
    "LocalDatasetManager",
    "UnconditionalGenerationDatasetManager",
    "UnconditionalPrompts",
    "parse_full_name",
]

log = logging.getLogger(__name__)

#: Trainer stages a manager can take part in.
STAGES = ("fit", "validate", "test", "predict")
#: Columns a preprocessed cache keeps.
OUTPUT_COLUMNS = ("input_ids", "loss_mask")
#: ``LocalDatasetManager.ds_type`` values and the ``datasets`` builder each one uses.
LOCAL_DS_TYPES = {"json": "json", "jsonl": "json", "csv": "csv", "parquet": "parquet",
                  "text": "text", "txt": "text"}
DEFAULT_PREPROCESS = "lightning_tune_data.preprocess.tokenize_text"
_OUTPUT_FEATURES = {
    "input_ids": datasets.List(datasets.Value("int32")),
    "loss_mask": datasets.List(datasets.Value("bool")),
}
_PROBE_ROWS = 8
#: Column that tags rows whose preprocessing failed (only with ``max_error_count > 0``).
_ERROR_COLUMN = "_preprocess_error"
#: Written into a finished cache: row count, skipped rows and the size of every file.
CACHE_MANIFEST = "_manifest.json"


class DataSourceError(ValueError):
    """A source is misconfigured or its data cannot be loaded; the message names source and fix."""


class CacheMissingError(FileNotFoundError):
    """``setup`` found no valid cache: ``prepare_data`` has not run for this configuration."""


def parse_full_name(full_name: str) -> tuple[str, str | None, str]:
    """Split ``owner/dataset[/config]/split`` into ``(path, config name or None, split)``.

    Args:
        full_name: e.g. ``"billion-word-benchmark/lm1b/train"`` -> ``("billion-word-benchmark/lm1b",
            None, "train")``; ``"owner/dataset/config/split"`` -> ``("owner/dataset", "config",
            "split")``.

    Raises:
        DataSourceError: The name does not have 3 or 4 non-empty ``/``-separated parts.
    """
    parts = full_name.split("/") if isinstance(full_name, str) else []
    if len(parts) not in (3, 4) or not all(p.strip() for p in parts):
        raise DataSourceError(
            f"full_name {full_name!r} must be 'owner/dataset/split' or "
            f"'owner/dataset/config/split' (e.g. 'billion-word-benchmark/lm1b/train'). For a "
            f"dataset without an owner, set path, name and split instead of full_name."
        )
    path = "/".join(parts[:2])
    return path, (parts[2] if len(parts) == 4 else None), parts[-1]


def _validate_stages(stages: Sequence[str] | None, owner: str) -> list[str]:
    if stages is None:
        return list(STAGES)
    if isinstance(stages, str):
        stages = [stages]
    bad = [s for s in stages if s not in STAGES]
    if bad or not stages:
        raise DataSourceError(
            f"{owner}: stages {list(stages)!r} invalid: {bad or 'empty list'}; each stage must be "
            f"one of {list(STAGES)} (or leave stages unset for all of them)."
        )
    return list(dict.fromkeys(stages))


def _causes(error: BaseException, limit: int = 4) -> str:
    """`` (caused by A: ...; B: ...)`` from an exception's chain (the root cause names the problem)."""
    parts: list[str] = []
    cause = error.__cause__ or error.__context__
    while cause is not None and len(parts) < limit:
        text = " ".join(str(cause).split())[:300]
        parts.append(f"{type(cause).__name__}: {text}" if text else type(cause).__name__)
        cause = cause.__cause__ or cause.__context__
    return f" (caused by {'; '.join(parts)})" if parts else ""


def _first_invalid_row(chunk: pa.Array) -> int:
    """Position of the first element of ``chunk`` that fails full Arrow validation."""
    for position in range(len(chunk)):
        try:
            chunk.slice(position, 1).validate(full=True)
        except pa.ArrowInvalid:
            return position
    return 0


def _safe_name(text: str, limit: int = 80) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._-")[:limit] or "source"


class _PreprocessRunner:
    """Picklable ``Dataset.map`` function: runs the preprocess function, checks and tags errors."""

    def __init__(
        self,
        fn: Callable,
        fn_label: str,
        tokenizer: Tokenizer,
        kwargs: Mapping[str, Any],
        description: str,
        max_error_count: int = 0,
    ) -> None:
        self.fn = fn
        self.fn_label = fn_label
        self.tokenizer = tokenizer
        self.kwargs = dict(kwargs)
        self.description = description
        self.has_loss_mask: bool | None = None  # fixed by the probe batch
        # With a budget, failing rows are not raised but tagged in _ERROR_COLUMN (one placeholder
        # row each); the manager counts the tags over the whole dataset after the map (so the
        # count is exact with num_proc) and drops them. This process stops early once its own
        # count alone exceeds the budget.
        self.max_error_count = max_error_count
        self.local_errors = 0
        self.first_error: str | None = None

    def _kwarg_naming(self, column: str) -> str | None:
        try:
            params = inspect.signature(self.fn).parameters
        except (TypeError, ValueError):
            return None
        for name, param in params.items():
            value = self.kwargs.get(name, param.default)
            if isinstance(value, str) and value == column:
                return name
        return None

    def _missing_column(self, column: str, available: list[str], kwarg: str | None) -> str:
        kwarg = kwarg or self._kwarg_naming(column)
        fix = (
            f"Set preprocess_kwargs: {{{kwarg}: <one of {available}>}}"
            if kwarg
            else "Rename the column in the data or use a preprocess_function that reads one of "
            "the available columns"
        )
        return (
            f"{self.description}: column '{column}' not found (needed by preprocess_function "
            f"{self.fn_label}); available columns: {available}. {fix}."
        )

    def __call__(self, examples: dict[str, list], indices: list[int]) -> dict[str, list]:
        rows = f"rows {indices[0]}-{indices[-1]}" if indices else "an empty batch"
        try:
            output = self.fn(examples, self.tokenizer, **self.kwargs)
        except MissingColumnError as error:
            raise self._missing_column_error(error, examples) from error
        except KeyError as error:
            key = error.args[0] if error.args else None
            if isinstance(key, str) and key not in examples:
                raise PreprocessError(
                    self._missing_column(key, list(examples), None)
                ) from error
            if self.max_error_count:
                return self._row_by_row(examples, indices)
            raise self._failure(rows, error) from error
        except Exception as error:  # noqa: BLE001 - reported with source, rows and traceback
            if self.max_error_count:
                return self._row_by_row(examples, indices)
            if isinstance(error, RowError):
                raise PreprocessError(self._row_error(error, indices)) from error
            raise self._failure(rows, error) from error
        result = self._check(output, rows)
        if self.max_error_count:
            result[_ERROR_COLUMN] = [None] * len(result["input_ids"])
        return result

    def _missing_column_error(self, error: MissingColumnError, examples: dict[str, list]) -> PreprocessError:
        return PreprocessError(self._missing_column(error.column, list(examples), error.kwarg))

    def _row_error(self, error: RowError, indices: list[int]) -> str:
        index = indices[error.row] if 0 <= error.row < len(indices) else error.row
        return (
            f"{self.description}: row {index}, column '{error.column}': {error.problem} "
            f"(preprocess_function {self.fn_label}). Fix or drop that row in the data."
        )

    def _row_by_row(self, examples: dict[str, list], indices: list[int]) -> dict[str, list]:
        """Re-run a failed batch one row at a time; tag the rows that fail (error budget mode)."""
        num_rows = len(next(iter(examples.values()))) if examples else 0
        merged: dict[str, list] = {"input_ids": [], _ERROR_COLUMN: []}
        if self.has_loss_mask:
            merged["loss_mask"] = []
        for position in range(num_rows):
            index = indices[position] if position < len(indices) else position
            one_row = {key: values[position : position + 1] for key, values in examples.items()}
            try:
                output = self.fn(one_row, self.tokenizer, **self.kwargs)
            except MissingColumnError as error:
                raise self._missing_column_error(error, examples) from error
            except Exception as error:  # noqa: BLE001 - counted against max_error_count
                if isinstance(error, RowError):
                    error.row = position  # within this batch; _row_error maps it to the dataset
                    trace = "".join(traceback.format_exception(error)).rstrip()
                    message = f"{self._row_error(error, indices)}\n{trace}"
                else:
                    message = str(self._failure(f"row {index}", error))
                self.local_errors += 1
                if self.local_errors > self.max_error_count:
                    raise PreprocessError(
                        f"{self.description}: more than max_error_count={self.max_error_count} rows "
                        f"failed preprocessing. First failure: {self.first_error or message}"
                    ) from error
                self.first_error = self.first_error or message
                merged["input_ids"].append([])
                if "loss_mask" in merged:
                    merged["loss_mask"].append([])
                merged[_ERROR_COLUMN].append(message)
                continue
            result = self._check(output, f"row {index}")
            if "loss_mask" in result and "loss_mask" not in merged:
                merged["loss_mask"] = [[] for _ in merged["input_ids"]]
            merged["input_ids"].extend(result["input_ids"])
            if "loss_mask" in merged:
                merged["loss_mask"].extend(result.get("loss_mask", []))
            merged[_ERROR_COLUMN].extend([None] * len(result["input_ids"]))
        return merged

    def _failure(self, rows: str, error: BaseException) -> PreprocessError:
        trace = "".join(traceback.format_exception(error)).rstrip()
        return PreprocessError(
            f"{self.description}: preprocess_function {self.fn_label} failed on {rows}: "
            f"{type(error).__name__}: {error}\n{trace}"
        )

    def _check(self, output: Any, rows: str) -> dict[str, list]:
        if not isinstance(output, Mapping) or "input_ids" not in output:
            got = sorted(output) if isinstance(output, Mapping) else type(output).__name__
            raise PreprocessError(
                f"{self.description}: preprocess_function {self.fn_label} returned {got} for "
                f"{rows}; it must return a dict with an 'input_ids' column (list of token-id "
                f"lists), optionally 'loss_mask'."
            )
        result = {key: output[key] for key in OUTPUT_COLUMNS if key in output}
        has_mask = "loss_mask" in result
        if self.has_loss_mask is None:
            self.has_loss_mask = has_mask
        elif has_mask != self.has_loss_mask:
            raise PreprocessError(
                f"{self.description}: preprocess_function {self.fn_label} returned 'loss_mask' "
                f"for some batches but not others ({rows}); return it for every batch or never."
            )
        if has_mask:
            ids, masks = result["input_ids"], result["loss_mask"]
            if len(ids) != len(masks) or any(len(a) != len(b) for a, b in zip(ids, masks)):
                raise PreprocessError(
                    f"{self.description}: preprocess_function {self.fn_label} returned "
                    f"'loss_mask' rows whose lengths differ from 'input_ids' ({rows}); they must "
                    f"match token for token."
                )
        return result


class DatasetManager:
    """One source: a Hugging Face dataset (or anything ``datasets.load_dataset`` loads).

    Args:
        full_name: ``owner/dataset/split`` or ``owner/dataset/config/split``; alternative to
            ``path``/``name``/``split``.
        path: ``load_dataset`` path (hub id, builder name like ``"json"``, or local folder).
        name: Dataset configuration name (``load_dataset``'s ``name``).
        split: Split to load, e.g. ``"train"`` or ``"train[:1%]"``.
        data_files: ``load_dataset``'s ``data_files``.
        weight: Relative sampling weight when several train sources are interleaved (>= 0).
        preprocess_function: Dotted path or callable ``fn(examples, tokenizer, **kwargs)``
            returning ``{"input_ids", ["loss_mask"]}``; ``None`` when the data already holds an
            ``input_ids`` column.
        preprocess_kwargs: Extra keyword arguments for ``preprocess_function``.
        columns_to_remove: Columns dropped by the ``.map`` (default: all original columns). The
            cache keeps only ``input_ids`` (and ``loss_mask``) either way.
        stages: Trainer stages this source is used in (default: all of fit/validate/test/predict).
        streaming: Stream with ``load_dataset(streaming=True)`` and tokenize lazily (no cache).
        num_proc: Processes for download preparation and tokenization.
        load_kwargs: Extra keyword arguments for ``datasets.load_dataset`` (``revision``, ...).
        shuffle: Whether the training stream shuffles this source.
        max_error_count: Rows whose preprocessing fails, or samples whose stream transforms
            raise, that may be skipped (and counted) before raising with the first failure's row
            and traceback. Preprocessing failures are counted over the whole dataset (the count
            is in the cache's ``_manifest.json`` as ``skipped_rows``); transform failures per
            rank x worker shard. Streaming sources cannot skip preprocessing failures.
        message_transform, model_transform, output_transform: optional per-sample callables
            (or dotted paths) applied in this order to each streamed train document.
        filter_fn: optional predicate (or dotted path) ``filter_fn(sample, **filter_kwargs)``;
            ``False`` skips the sample.
        filter_kwargs: keyword arguments for ``filter_fn``.
    """

    def __init__(
        self,
        full_name: str | None = None,
        path: str | None = None,
        name: str | None = None,
        split: str | None = None,
        data_files: str | list[str] | dict[str, str | list[str]] | None = None,
        weight: float = 1.0,
        preprocess_function: str | Callable | None = DEFAULT_PREPROCESS,
        preprocess_kwargs: dict | None = None,
        columns_to_remove: list[str] | None = None,
        stages: list[str] | None = None,
        streaming: bool = False,
        num_proc: int | None = None,
        load_kwargs: dict | None = None,
        shuffle: bool = True,
        max_error_count: int = 0,
        message_transform: str | Callable | None = None,
        model_transform: str | Callable | None = None,
        output_transform: str | Callable | None = None,
        filter_fn: str | Callable | None = None,
        filter_kwargs: dict | None = None,
    ) -> None:
        owner = type(self).__name__
        if full_name is not None:
            if path is not None or name is not None or split is not None:
                raise DataSourceError(
                    f"{owner}: give either full_name ({full_name!r}) or path/name/split, not both."
                )
            path, name, split = parse_full_name(full_name)
        elif path is None or split is None:
            raise DataSourceError(
                f"{owner}: set full_name ('owner/dataset[/config]/split') or both path and split "
                f"(got path={path!r}, split={split!r})."
            )
        self.full_name = full_name
        self.path = path
        self.name = name
        self.split = split
        self.data_files = data_files
        self.source_name: str | None = None
        self._init_common(
            weight=weight,
            preprocess_function=preprocess_function,
            preprocess_kwargs=preprocess_kwargs,
            columns_to_remove=columns_to_remove,
            stages=stages,
            streaming=streaming,
            num_proc=num_proc,
            load_kwargs=load_kwargs,
            shuffle=shuffle,
            max_error_count=max_error_count,
            transforms=dict(message_transform=message_transform, model_transform=model_transform,
                            output_transform=output_transform, filter_fn=filter_fn,
                            filter_kwargs=filter_kwargs),
        )

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
        if not isinstance(weight, (int, float)) or not np.isfinite(weight) or weight < 0:
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

    def _local_folder_identity(self) -> list[list[Any]] | None:
        """For a ``path`` that is a local dataset folder: (file, size, mtime_ns) of its files."""
        if self.path is None or not os.path.isdir(self.path):
            return None
        root = Path(self.path).resolve()
        entries = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for filename in sorted(filenames):
                stat = os.stat(os.path.join(dirpath, filename))
                entries.append([os.path.relpath(os.path.join(dirpath, filename), root),
                                stat.st_size, stat.st_mtime_ns])
        return [[str(root)], *entries]

    def _source_spec(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "name": self.name,
            "split": self.split,
            "data_files": self.data_files,
            "data_file_identities": self._data_file_identities(),
            "local_folder": self._local_folder_identity(),
            "load_kwargs": self.load_kwargs,
        }

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

    # ------------------------------------------------------------------------------ loading

    def _load_data_files(self) -> Any:
        return self.data_files

    def _load(self, cache_dir: str | Path, streaming: bool) -> datasets.Dataset | datasets.IterableDataset:
        kwargs: dict[str, Any] = dict(self.load_kwargs)
        if self._load_data_files() is not None:
            kwargs["data_files"] = self._load_data_files()
        if not streaming and self.num_proc is not None:
            kwargs.setdefault("num_proc", self.num_proc)
        try:
            dataset = datasets.load_dataset(
                self.path,
                self.name,
                split=self.split,
                cache_dir=str(Path(cache_dir) / "hf_datasets"),
                streaming=streaming,
                **kwargs,
            )
        except Exception as error:  # noqa: BLE001 - re-raised with the source named
            problems = self._data_file_problems()
            found = f" Problems found in the data files: {'; '.join(problems)}." if problems else ""
            raise DataSourceError(
                f"{self.source_description}: datasets.load_dataset failed: "
                f"{type(error).__name__}: {error}{_causes(error)}.{found} Check path/name/split/"
                f"data_files (and the network or HF_HUB_OFFLINE for hub datasets)."
            ) from error
        if isinstance(dataset, (datasets.DatasetDict, datasets.IterableDatasetDict)):
            raise DataSourceError(
                f"{self.source_description}: load_dataset returned several splits "
                f"{list(dataset)}; set split to one of them."
            )
        return dataset

    def _runner(self, tokenizer: Tokenizer, max_error_count: int = 0) -> _PreprocessRunner:
        fn = self.preprocess_fn
        assert fn is not None
        return _PreprocessRunner(
            fn, self._preprocess_label(), tokenizer, self.preprocess_kwargs, self.source_description,
            max_error_count=max_error_count,
        )

    def _local_data_files(self) -> list[str]:
        """The data files that are local paths (remote URLs and hub files are left out)."""
        files = self._load_data_files()
        if files is None:
            return []
        if isinstance(files, Mapping):
            files = files.get(self.split, []) if self.split in files else list(files.values())
        flat: list[str] = []
        for entry in [files] if isinstance(files, str) else list(files):
            flat.extend([entry] if isinstance(entry, (str, os.PathLike)) else list(entry))
        return [os.fspath(f) for f in flat if os.path.isfile(os.fspath(f))]

    def _data_file_problems(self, limit: int = 5) -> list[str]:
        """Name what is wrong with the local data files: empty, not UTF-8, malformed JSON lines,
        columns that differ between files. Only run when loading or checking failed (it reads
        every file once)."""
        builder = self.path if self.path in ("json", "csv", "text") else None
        problems: list[str] = []
        columns: dict[str, list[str]] = {}
        for path in self._local_data_files():
            if len(problems) >= limit:
                break
            if os.path.getsize(path) == 0:
                problems.append(f"{path} is empty (0 bytes)")
                continue
            if builder is None:
                continue
            with open(path, "rb") as handle:
                json_lines = builder == "json" and not handle.read(64).lstrip().startswith(b"[")
                handle.seek(0)
                for number, raw in enumerate(handle, 1):
                    try:
                        line = raw.decode("utf-8")
                    except UnicodeDecodeError as error:
                        problems.append(
                            f"{path} line {number}: not valid UTF-8 (byte {raw[error.start]:#04x} at "
                            f"column {error.start + 1}); re-encode the file as UTF-8"
                        )
                        break
                    if builder == "csv" and number == 1:
                        delimiter = self.load_kwargs.get("delimiter", self.load_kwargs.get("sep", ","))
                        columns[path] = [c.strip() for c in line.rstrip("\r\n").split(delimiter)]
                    if not json_lines or not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except ValueError as error:
                        problems.append(f"{path} line {number}: not valid JSON ({error})")
                        break
                    if not isinstance(record, dict):
                        problems.append(
                            f"{path} line {number}: expected a JSON object per line, got "
                            f"{type(record).__name__}"
                        )
                        break
                    columns.setdefault(path, sorted(record))
        if len({tuple(c) for c in columns.values()}) > 1:
            listed = "; ".join(f"{os.path.basename(p)}: {c}" for p, c in columns.items())
            problems.append(f"the files have different columns ({listed})")
        return problems[:limit]

    def _check_input_table(self, dataset: datasets.Dataset) -> None:
        """Fail, naming row, column and file, on raw data Arrow cannot read (e.g. invalid UTF-8)."""
        table = dataset.data.table
        for name in table.column_names:
            offset = 0
            for chunk in table.column(name).chunks:
                try:
                    chunk.validate(full=True)
                except pa.ArrowInvalid as error:
                    row = offset + _first_invalid_row(chunk)
                    problems = self._data_file_problems()
                    found = f" Problems found in the data files: {'; '.join(problems)}." if problems else ""
                    raise PreprocessError(
                        f"{self.source_description}: row {row}, column '{name}' holds data that is "
                        f"not valid ({error}), e.g. text that is not UTF-8.{found} Fix the data "
                        f"(re-encode the file as UTF-8) and run prepare_data again."
                    ) from error
                offset += len(chunk)

    def _removed_columns(self, columns: list[str]) -> list[str]:
        if self.columns_to_remove is None:
            return list(columns)
        missing = [c for c in self.columns_to_remove if c not in columns]
        if missing:
            raise DataSourceError(
                f"{self.source_description}: columns_to_remove {missing} not found; available "
                f"columns: {columns}. Fix columns_to_remove (or leave it unset to drop all)."
            )
        return list(self.columns_to_remove)

    def _pretokenized(self, dataset: Any, columns: list[str]) -> Any:
        if "input_ids" not in columns:
            raise DataSourceError(
                f"{self.source_description}: preprocess_function is None, so the data must hold "
                f"an 'input_ids' column; available columns: {columns}. Set preprocess_function, "
                f"e.g. '{DEFAULT_PREPROCESS}'."
            )
        return dataset.select_columns([c for c in OUTPUT_COLUMNS if c in columns])

    def _preprocess(
        self, dataset: datasets.Dataset, tokenizer: Tokenizer, work_dir: Path, fingerprint: str
    ) -> datasets.Dataset:
        columns = list(dataset.column_names)
        if self.preprocess_function is None:
            return self._pretokenized(dataset, columns)
        self._check_input_table(dataset)
        runner = self._runner(tokenizer, self.max_error_count)
        removed = self._removed_columns(columns)
        if len(dataset) == 0:
            log.warning("%s has no rows", self.source_description)
        else:  # fail fast, in this process, on a small batch
            probe_rows = min(_PROBE_ROWS, len(dataset))
            runner(dataset[:probe_rows], list(range(probe_rows)))
            runner.local_errors, runner.first_error = 0, None  # the map counts these rows again
        out_columns = ["input_ids"] + (["loss_mask"] if runner.has_loss_mask else [])
        kept = [c for c in columns if c not in removed and c not in out_columns]
        tagged = {_ERROR_COLUMN: datasets.Value("string")} if self.max_error_count else {}
        features = datasets.Features(
            {**{c: dataset.features[c] for c in kept}, **{c: _OUTPUT_FEATURES[c] for c in out_columns},
             **tagged}
        )
        work_dir.mkdir(parents=True, exist_ok=True)
        mapped = dataset.map(
            runner,
            batched=True,
            with_indices=True,
            num_proc=self.num_proc,
            remove_columns=removed,
            features=features,
            cache_file_name=str(work_dir / "tokenized.arrow"),
            load_from_cache_file=False,
            new_fingerprint=fingerprint[:32],  # datasets appends a per-process suffix (max 64)
            desc=f"Tokenizing {self.source_description}",
        )
        if self.max_error_count:
            mapped = self._drop_failed_rows(mapped)
        return mapped.select_columns(out_columns)

    def _drop_failed_rows(self, mapped: datasets.Dataset) -> datasets.Dataset:
        """Count the rows tagged as failed over the whole dataset; raise past the budget, else drop them."""
        tagged = mapped.data.table.column(_ERROR_COLUMN).is_valid().to_numpy(zero_copy_only=False)
        failed = np.flatnonzero(tagged)
        self._skipped_rows = len(failed)
        if not len(failed):
            return mapped
        first = mapped.data.table.column(_ERROR_COLUMN)[int(failed[0])].as_py()
        if len(failed) > self.max_error_count:
            raise PreprocessError(
                f"{self.source_description}: {len(failed)} rows failed preprocessing, more than "
                f"max_error_count={self.max_error_count}. First failure: {first}"
            )
        warnings.warn(
            f"{self.source_description}: skipped {len(failed)} rows whose preprocessing failed "
            f"(max_error_count={self.max_error_count}); the cache holds only the other rows. First "
            f"failure: {first}",
            stacklevel=2,
        )
        return mapped.select(np.flatnonzero(~tagged))

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

    def _setup_streaming(self, tokenizer: Tokenizer, cache_dir: str | Path) -> datasets.IterableDataset:
        dataset = self._load(cache_dir, streaming=True)
        try:
            first = next(iter(dataset.take(1)))
        except StopIteration:
            first = None
        columns = list(dataset.column_names or (first.keys() if first is not None else []))
        if self.preprocess_function is None:
            return self._pretokenized(dataset, columns)
        runner = self._runner(tokenizer)
        removed = self._removed_columns(columns)
        if first is not None:  # fail fast on the first row
            runner({key: [value] for key, value in first.items()}, [0])
        out_columns = ["input_ids"] + (["loss_mask"] if runner.has_loss_mask else [])
        mapped = dataset.map(runner, batched=True, with_indices=True, remove_columns=removed)
        return mapped.select_columns(out_columns)

    def stream_transforms(self) -> dict[str, Any]:
        """Per-sample transforms and filter for this source's train stream (seeds 000/002).

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


def _resolve_local_files(entries: str | Sequence[str], field: str) -> tuple[list[str], list[str]]:
    """Expand globs and make paths absolute; return ``(files, missing entries)``."""
    found: list[str] = []
    missing: list[str] = []
    for entry in [entries] if isinstance(entries, str) else list(entries):
        if not isinstance(entry, (str, os.PathLike)):
            raise DataSourceError(f"LocalDatasetManager {field}: expected file paths, got {entry!r}.")
        path = os.path.abspath(os.path.expanduser(os.fspath(entry)))
        if glob.has_magic(path):
            matches = sorted(p for p in glob.glob(path, recursive=True) if os.path.isfile(p))
            if matches:
                found.extend(matches)
            else:
                missing.append(path)
        elif os.path.isfile(path):
            found.append(path)
        else:
            missing.append(path)
    return found, missing


class LocalDatasetManager(DatasetManager):
    """A source made of local files: JSON / JSON Lines, CSV, Parquet or plain text.

    The files' identities (path, size, mtime, head/tail hash) are part of the cache key, so
    editing a file rebuilds its cache. Relative paths and globs are resolved at construction.

    Args:
        data_files: A path, a list of paths (globs allowed), or ``{split: path(s)}``.
        ds_type: ``"json"`` (also ``.jsonl``), ``"jsonl"``, ``"csv"``, ``"parquet"`` or ``"text"``
            (one row per line, column ``text``).
        split: Split name; with a ``{split: files}`` mapping it selects the entry.
        weight: See :class:`DatasetManager` (all remaining arguments are the same).
        preprocess_function: See :class:`DatasetManager`.
        preprocess_kwargs: See :class:`DatasetManager`.
        columns_to_remove: See :class:`DatasetManager`.
        stages: See :class:`DatasetManager`.
        streaming: See :class:`DatasetManager`.
        num_proc: See :class:`DatasetManager`.
        load_kwargs: Extra ``load_dataset`` options (e.g. ``{"delimiter": ";"}`` for CSV).
        shuffle: See :class:`DatasetManager`.
        max_error_count: See :class:`DatasetManager`.
        message_transform, model_transform, output_transform, filter_fn, filter_kwargs: See
            :class:`DatasetManager`.

    Raises:
        DataSourceError: Unknown ``ds_type`` or split.
        FileNotFoundError: Some data files do not exist; all missing paths are listed.
    """

    def __init__(
        self,
        data_files: str | list[str] | dict[str, str | list[str]],
        ds_type: str = "json",
        split: str = "train",
        weight: float = 1.0,
        preprocess_function: str | Callable | None = DEFAULT_PREPROCESS,
        preprocess_kwargs: dict | None = None,
        columns_to_remove: list[str] | None = None,
        stages: list[str] | None = None,
        streaming: bool = False,
        num_proc: int | None = None,
        load_kwargs: dict | None = None,
        shuffle: bool = True,
        max_error_count: int = 0,
        message_transform: str | Callable | None = None,
        model_transform: str | Callable | None = None,
        output_transform: str | Callable | None = None,
        filter_fn: str | Callable | None = None,
        filter_kwargs: dict | None = None,
    ) -> None:
        if ds_type not in LOCAL_DS_TYPES:
            raise DataSourceError(
                f"LocalDatasetManager(data_files={data_files!r}): ds_type {ds_type!r} is not "
                f"supported; use one of {sorted(LOCAL_DS_TYPES)}."
            )
        if isinstance(data_files, Mapping):
            if split not in data_files:
                raise DataSourceError(
                    f"LocalDatasetManager(data_files={data_files!r}): split {split!r} is not a "
                    f"key of data_files; set split to one of {list(data_files)}."
                )
            entries = data_files[split]
        else:
            entries = data_files
        if not entries:
            raise DataSourceError(f"LocalDatasetManager: data_files is empty ({data_files!r}).")
        files, missing = _resolve_local_files(entries, "data_files")
        if missing:
            raise FileNotFoundError(
                f"LocalDatasetManager data_files: {len(missing)} file(s) not found: {missing} "
                f"(relative paths are resolved against the working directory {os.getcwd()}). "
                f"Fix the paths in data_files or create the files first."
            )
        self.ds_type = ds_type
        self.full_name = None
        self.path = LOCAL_DS_TYPES[ds_type]
        self.name = None
        self.split = split
        self.data_files = files
        self.source_name = None
        self._init_common(
            weight=weight,
            preprocess_function=preprocess_function,
            preprocess_kwargs=preprocess_kwargs,
            columns_to_remove=columns_to_remove,
            stages=stages,
            streaming=streaming,
            num_proc=num_proc,
            load_kwargs=load_kwargs,
            shuffle=shuffle,
            max_error_count=max_error_count,
            transforms=dict(message_transform=message_transform, model_transform=model_transform,
                            output_transform=output_transform, filter_fn=filter_fn,
                            filter_kwargs=filter_kwargs),
        )

    def _source_label(self) -> str:
        names = [os.path.basename(f) for f in self.data_files]
        shown = names if len(names) <= 3 else names[:3] + [f"... ({len(names)} files)"]
        return f"{self.ds_type} data_files={shown}"

    def _cache_stem(self) -> str:
        stems = [Path(f).stem for f in self.data_files[:2]]
        more = f"+{len(self.data_files) - 2}" if len(self.data_files) > 2 else ""
        return _safe_name("_".join(stems) + more + f"-{self.split}")

    def _load_data_files(self) -> Any:
        return {self.split: list(self.data_files)}

    def _data_file_identities(self) -> list[dict[str, Any]]:
        missing = [f for f in self.data_files if not os.path.isfile(f)]
        if missing:
            raise FileNotFoundError(
                f"{self.source_description}: data files disappeared since configuration: "
                f"{missing}. Restore them or fix data_files."
            )
        return [cache.file_identity(f) for f in self.data_files]

    def _source_spec(self) -> dict[str, Any]:
        return {
            "ds_type": self.path,
            "split": self.split,
            "data_file_identities": self._data_file_identities(),
            "load_kwargs": self.load_kwargs,
        }


class UnconditionalPrompts(TorchDataset):
    """``num_examples`` BOS-only prompts for unconditional generation (map-style, indexable).

    Item ``i`` is ``{"input_ids": np.array([bos_id]), "source": source, "epoch": 0, "index": k}``
    where ``k`` is the global example index (``indices[i]``).

    Args:
        bos_id: The tokenizer's BOS id.
        indices: Global example indices this object serves (a ``range`` for one rank's block).
        source: Source name reported with every sample.
    """

    def __init__(self, bos_id: int, indices: Sequence[int], source: str) -> None:
        self.bos_id = int(bos_id)
        self.indices = indices
        self.source = source

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, position: int) -> dict[str, Any]:
        return {
            "input_ids": np.array([self.bos_id], dtype=np.int64),
            "source": self.source,
            "epoch": 0,
            "index": int(self.indices[position]),
        }

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for position in range(len(self)):
            yield self[position]


class UnconditionalGenerationDatasetManager(DatasetManager):
    """Prompts for unconditional generation: ``num_examples`` samples holding only BOS.

    Nothing is downloaded or cached. Under DDP, use :meth:`examples_for_rank` (or
    ``setup(..., rank=, world_size=)``) to give each rank a disjoint block, so no prompt is
    generated twice (a padding ``DistributedSampler`` would repeat some).

    Args:
        num_examples: Number of prompts (>= 1).
        stages: Trainer stages this source is used in (default: all).
    """

    def __init__(self, num_examples: int, stages: list[str] | None = None) -> None:
        if not isinstance(num_examples, int) or isinstance(num_examples, bool) or num_examples < 1:
            raise DataSourceError(
                f"UnconditionalGenerationDatasetManager: num_examples must be an integer >= 1, "
                f"got {num_examples!r}."
            )
        self.num_examples = num_examples
        self.full_name = None
        self.path = None
        self.name = None
        self.split = None
        self.data_files = None
        self.source_name = None
        self.weight = 1.0
        self.stages = _validate_stages(stages, "UnconditionalGenerationDatasetManager")
        self.streaming = False
        self.num_proc = None
        self.load_kwargs = {}
        self.shuffle = False
        self.max_error_count = 0
        self.columns_to_remove = None
        self.preprocess_function = None
        self.preprocess_kwargs = {}

    def _source_label(self) -> str:
        return f"unconditional generation, num_examples={self.num_examples}"

    def _source_spec(self) -> dict[str, Any]:
        return {"num_examples": self.num_examples}

    def cache_dir_for(self, tokenizer: Tokenizer, cache_dir: str | Path) -> Path:
        """Not applicable: unconditional prompts are never cached."""
        raise DataSourceError(f"{self.source_description} has no cache (nothing to preprocess).")

    def examples_for_rank(self, rank: int, world_size: int) -> list[int]:
        """Indices of the prompts rank ``rank`` generates: a contiguous block.

        Blocks of all ranks cover ``0..num_examples-1`` exactly once; sizes differ by at most one
        (the first ``num_examples % world_size`` ranks get one more).

        Args:
            rank: This process's rank, ``0 <= rank < world_size``.
            world_size: Number of ranks.
        """
        return list(self._block(rank, world_size))

    def _block(self, rank: int, world_size: int) -> range:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}.")
        base, extra = divmod(self.num_examples, world_size)
        start = rank * base + min(rank, extra)
        return range(start, start + base + (1 if rank < extra else 0))

    def prepare_data(self, tokenizer: Tokenizer, cache_dir: str | Path | None = None) -> Path | None:
        """Nothing to prepare; returns ``None``."""
        return None

    def setup(
        self,
        tokenizer: Tokenizer,
        cache_dir: str | Path | None = None,
        rank: int = 0,
        world_size: int = 1,
    ) -> UnconditionalPrompts:
        """Return the prompts of ``rank`` (all of them with the default ``world_size=1``).

        Args:
            tokenizer: Supplies ``bos_id``.
            cache_dir: Unused (accepted for a uniform manager interface).
            rank: This process's rank.
            world_size: Number of ranks sharing the prompts.
        """
        return UnconditionalPrompts(
            tokenizer.bos_id, self._block(rank, world_size), self.source_name or "unconditional"
        )

    def __repr__(self) -> str:
        return (
            f"UnconditionalGenerationDatasetManager(num_examples={self.num_examples}, "
            f"stages={self.stages})"
        )
