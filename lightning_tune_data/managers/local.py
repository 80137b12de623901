"""``LocalDatasetManager``: a source made of local JSON(L), CSV, Parquet or text files."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lightning_tune_data.cache.checksums import file_identity
from lightning_tune_data.cache.layout import safe_name
from lightning_tune_data.managers.errors import DataSourceError
from lightning_tune_data.managers.hub import DatasetManager
from lightning_tune_data.managers.input_files import resolve_local_files
from lightning_tune_data.managers.options import DEFAULT_PREPROCESS, SourceOptions

__all__ = ["COMPRESSION_SUFFIXES", "EXTENSION_DS_TYPES", "LOCAL_DS_TYPES", "LocalDatasetManager", "file_ds_type",
           "resolve_ds_type"]

#: ``LocalDatasetManager.ds_type`` values and the ``datasets`` builder each one uses.
LOCAL_DS_TYPES = {"json": "json", "jsonl": "json", "csv": "csv", "parquet": "parquet",
                  "text": "text", "txt": "text"}
#: File extensions ``ds_type`` is inferred from (after a compression suffix is stripped).
EXTENSION_DS_TYPES = {".json": "json", ".jsonl": "json", ".ndjson": "json", ".csv": "csv",
                      ".parquet": "parquet", ".pq": "parquet", ".txt": "text", ".text": "text"}
COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".zst", ".zstd", ".lz4", ".zip")


def file_ds_type(path: str) -> str | None:
    """The ``ds_type`` a file's extension implies (``data.jsonl.gz`` -> ``"json"``), or ``None``.

    Args:
        path: A data file's path.
    """
    name = os.path.basename(path).lower()
    for suffix in COMPRESSION_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return EXTENSION_DS_TYPES.get(os.path.splitext(name)[1])


def resolve_ds_type(ds_type: str | None, files: list[str]) -> str:
    """``ds_type`` as given, checked against the files' extensions, or inferred from them.

    Args:
        ds_type: The ``ds_type`` given, or ``None`` to infer it.
        files: The resolved data files.

    Raises:
        DataSourceError: The extensions disagree with each other or with ``ds_type``, or no
            ``ds_type`` is given and no file has a known extension.
    """
    by_type: dict[str, list[str]] = {}
    unknown: list[str] = []
    for path in files:
        kind = file_ds_type(path)
        if kind is None:
            unknown.append(os.path.basename(path))
        else:
            by_type.setdefault(kind, []).append(os.path.basename(path))
    shown = {kind: names[:3] + ([f"... ({len(names)} files)"] if len(names) > 3 else [])
             for kind, names in by_type.items()}
    if ds_type is not None:
        builder = LOCAL_DS_TYPES[ds_type]
        conflicting = {kind: names for kind, names in shown.items() if kind != builder}
        if conflicting:
            raise DataSourceError(
                f"LocalDatasetManager: ds_type {ds_type!r} conflicts with the extension of "
                f"data_files {conflicting} (read as {', '.join(conflicting)}). Set ds_type to match the "
                f"files, or leave ds_type unset to infer it from the extensions."
            )
        return ds_type
    if len(by_type) > 1:
        raise DataSourceError(
            f"LocalDatasetManager: data_files mix file types {shown}. Use one LocalDatasetManager per "
            f"file type (or set ds_type explicitly if the extensions are misleading)."
        )
    if unknown or not by_type:
        raise DataSourceError(
            f"LocalDatasetManager: cannot infer ds_type from the extension of data_files "
            f"{unknown[:3]}; known extensions are {sorted(EXTENSION_DS_TYPES)} (optionally "
            f"compressed: {', '.join(COMPRESSION_SUFFIXES)}). Set ds_type to one of "
            f"{sorted(set(LOCAL_DS_TYPES) - {'jsonl', 'txt'})}."
        )
    return next(iter(by_type))


class LocalDatasetManager(DatasetManager):
    """A source made of local files: JSON / JSON Lines, CSV, Parquet or plain text.

    The files' identities (path, size, mtime, head/tail hash) are part of the cache key, so
    editing a file rebuilds its cache. Relative paths and globs are resolved at construction.

    Args:
        data_files: A path, a list of paths (globs allowed), or ``{split: path(s)}``.
        ds_type: ``"json"`` (JSON or JSON Lines), ``"csv"``, ``"parquet"`` or ``"text"`` (one
            row per line, column ``text``). Default: inferred from the files' extensions
            (``.json``, ``.jsonl``, ``.csv``, ``.parquet``, ``.txt``, also ``.gz``/``.zst``/...
            compressed); an explicit value that contradicts the extensions is an error.
        skip_blank_lines: With ``ds_type="text"``, drop lines that are empty or only whitespace
            (by default each of them becomes a document holding just BOS and EOS).
        split: Split name; with a ``{split: files}`` mapping it selects the entry.
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
        load_kwargs: Extra ``load_dataset`` options (e.g. ``{"delimiter": ";"}`` for CSV).
        shuffle: Whether the training stream shuffles this source.
        max_error_count: Rows whose preprocessing fails, or samples whose stream transforms
            raise, that may be skipped (and counted) before raising with the first failure's row
            and traceback. Preprocessing failures are counted over the whole dataset (the count
            is in the store's commit as ``skipped_rows``); transform failures per
            rank x worker shard. Streaming sources skip and count preprocessing failures as they
            stream, per shard.
        message_transform, model_transform, output_transform: optional per-sample callables
            (or dotted paths) applied in this order to each streamed train document.
        filter_fn: optional predicate (or dotted path) ``filter_fn(sample, **filter_kwargs)``;
            ``False`` skips the sample.
        filter_kwargs: keyword arguments for ``filter_fn``.
        stream_retries: network retries of a streaming source, e.g. ``{"max_retries": 3,
            "retry_backoff_s": 1.0, "retry_timeout_s": 300, "read_timeout_s": 60}`` (these are the
            defaults): a failed read is retried ``max_retries`` times in a row, waiting
            ``retry_backoff_s`` doubled each time, within ``retry_timeout_s`` seconds; a server
            silent for ``read_timeout_s`` counts as a failure.
        cache_dir: where this source's store lives instead of under the datamodule's
            ``cache_dir`` (a local path or an fsspec URL; the datamodule's ``storage_options`` apply).

    Raises:
        DataSourceError: Unknown or contradicting ``ds_type``, or unknown split.
        FileNotFoundError: Some data files do not exist; all missing paths are listed.
        max_epochs: most passes over this source a train run takes (fractional allowed; ``None``:
            no cap). When the plan reaches it, the source drops to weight 0 and the others share the mix.
        max_tokens: most tokens a train run takes from this source (a number or ``"30M"``,
            ``"40B"``; ``None``: no cap).
    """

    def __init__(
        self,
        data_files: str | list[str] | dict[str, str | list[str]],
        ds_type: str | None = None,
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
        stream_retries: dict | None = None,
        skip_blank_lines: bool = False,
        cache_dir: str | None = None,
        max_epochs: float | None = None,
        max_tokens: int | str | None = None,
    ) -> None:
        if ds_type is not None and ds_type not in LOCAL_DS_TYPES:
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
        files, missing = resolve_local_files(entries, "data_files")
        if missing:
            raise FileNotFoundError(
                f"LocalDatasetManager data_files: {len(missing)} file(s) not found: {missing} "
                f"(relative paths are resolved against the working directory {os.getcwd()}). "
                f"Fix the paths in data_files or create the files first."
            )
        ds_type = resolve_ds_type(ds_type, files)
        if skip_blank_lines and LOCAL_DS_TYPES[ds_type] != "text":
            raise DataSourceError(
                f"LocalDatasetManager(data_files={data_files!r}): skip_blank_lines applies to "
                f"ds_type 'text' only (got {ds_type!r}). Remove skip_blank_lines."
            )
        self.ds_type = ds_type
        self.skip_blank_lines = bool(skip_blank_lines)
        self.full_name = None
        self.path = LOCAL_DS_TYPES[ds_type]
        self.name = None
        self.split = split
        self.data_files = files
        self.source_name = None
        self.options = SourceOptions.from_arguments(self.source_description, locals())

    def _source_label(self) -> str:
        names = [os.path.basename(f) for f in self.data_files]
        shown = names if len(names) <= 3 else names[:3] + [f"... ({len(names)} files)"]
        return f"{self.ds_type} data_files={shown}"

    def _cache_stem(self) -> str:
        stems = [Path(f).stem for f in self.data_files[:2]]
        more = f"+{len(self.data_files) - 2}" if len(self.data_files) > 2 else ""
        return safe_name("_".join(stems) + more + f"-{self.split}")

    def _load_data_files(self) -> Any:
        return {self.split: list(self.data_files)}

    def _data_file_identities(self, memo_dir: str | Path | None) -> list[dict[str, Any]]:
        missing = [f for f in self.data_files if not os.path.isfile(f)]
        if missing:
            raise FileNotFoundError(
                f"{self.source_description}: data files disappeared since configuration: "
                f"{missing}. Restore them or fix data_files."
            )
        return [file_identity(f, memo_dir=memo_dir) for f in self.data_files]

    def _source_spec(self, memo_dir: str | Path | None) -> dict[str, Any]:
        spec = {
            "ds_type": self.path,
            "split": self.split,
            "data_file_identities": self._data_file_identities(memo_dir),
            "load_kwargs": self.options.load_kwargs,
        }
        if self.skip_blank_lines:  # only when set, so existing caches keep their key
            spec["skip_blank_lines"] = True
        return spec

    def _task_files(self) -> list[str] | None:
        return list(self.data_files)

    def _load(self, cache_dir: str | Path, streaming: bool, data_files: list[str] | None = None,
              revision: str | None = None) -> Any:
        dataset = super()._load(cache_dir, streaming, data_files, revision)
        if self.skip_blank_lines:
            dataset = dataset.filter(lambda row: bool(row["text"].strip()))
        return dataset
