"""``LocalDatasetManager``: a source made of local JSON(L), CSV, Parquet or text files."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from lightning_tune_data import cache
from lightning_tune_data.managers.config import DEFAULT_PREPROCESS, DataSourceError, _safe_name
from lightning_tune_data.managers.hub import DatasetManager
from lightning_tune_data.managers.input_files import _resolve_local_files

#: ``LocalDatasetManager.ds_type`` values and the ``datasets`` builder each one uses.
LOCAL_DS_TYPES = {"json": "json", "jsonl": "json", "csv": "csv", "parquet": "parquet",
                  "text": "text", "txt": "text"}


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
        stream_retries: See :class:`DatasetManager`.

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
        stream_retries: dict | None = None,
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
            stream_retries=stream_retries,
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
        return [self._file_identity(f) for f in self.data_files]

    def _source_spec(self) -> dict[str, Any]:
        return {
            "ds_type": self.path,
            "split": self.split,
            "data_file_identities": self._data_file_identities(),
            "load_kwargs": self.load_kwargs,
        }
