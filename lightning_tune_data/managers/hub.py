"""``DatasetManager``: a source loaded with ``datasets.load_dataset`` (a Hugging Face hub dataset,
a builder such as ``"json"`` with ``data_files``, or a local dataset folder)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import datasets

from lightning_tune_data.cache.checksums import file_identity
from lightning_tune_data.cache.layout import DOWNLOAD_FOLDER, safe_name
from lightning_tune_data.managers.base import SourceManager
from lightning_tune_data.managers.errors import DataSourceError, error_causes
from lightning_tune_data.managers.options import DEFAULT_PREPROCESS, SourceOptions

__all__ = ["LOCAL_BUILDERS", "DatasetManager", "parse_full_name"]


#: ``datasets`` builders that read files named by ``data_files`` rather than a hub repository.
LOCAL_BUILDERS = ("json", "csv", "parquet", "text", "arrow", "pandas")


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


class DatasetManager(SourceManager):
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
        load_kwargs: Extra keyword arguments for ``datasets.load_dataset`` (``revision``,
            ``cache_dir``, ...). Hub downloads go to the standard Hugging Face cache
            (``HF_DATASETS_CACHE``, ``~/.cache/huggingface/datasets``) unless ``cache_dir`` is
            given here; this package's own cache holds the tokenized data (and the Arrow
            conversion of local files).
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
            ``cache_dir`` (a local path or an fsspec URL such as ``s3://bucket/prefix``; the
            datamodule's ``storage_options`` apply).
        max_epochs: most passes over this source a train run takes (fractional allowed; ``None``:
            no cap). When the plan reaches it, the source drops to weight 0 and the others share the mix.
        max_tokens: most tokens a train run takes from this source (a number or ``"30M"``,
            ``"40B"``; ``None``: no cap).
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
        stream_retries: dict | None = None,
        cache_dir: str | None = None,
        max_epochs: float | None = None,
        max_tokens: int | str | None = None,
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
        self.options = SourceOptions.from_arguments(self.source_description, locals())

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

    def _cache_stem(self) -> str:
        return safe_name("-".join(str(p) for p in (self.path, self.name, self.split) if p))

    def _load_data_files(self) -> Any:
        """``load_dataset``'s ``data_files``."""
        return self.data_files

    def _local_data_files(self) -> list[str]:
        files = self._load_data_files()
        if files is None:
            return []
        if isinstance(files, Mapping):
            files = files.get(self.split, []) if self.split in files else list(files.values())
        flat: list[str] = []
        for entry in [files] if isinstance(files, str) else list(files):
            flat.extend([entry] if isinstance(entry, (str, os.PathLike)) else list(entry))
        return [os.fspath(f) for f in flat if os.path.isfile(os.fspath(f))]

    def _data_file_identities(self, memo_dir: str | Path | None) -> list[dict[str, Any]]:
        """Content identity of each local data file (hashes remembered in ``memo_dir``)."""
        return [file_identity(f, memo_dir=memo_dir) for f in self._local_data_files()]

    def _local_folder_identity(self, memo_dir: str | Path | None) -> list[Any] | None:
        """For a ``path`` that is a local dataset folder: the content identity of each file."""
        if self.path is None or not os.path.isdir(self.path):
            return None
        root = Path(self.path).resolve()
        entries: list[Any] = [[str(root)]]
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            entries.extend(file_identity(os.path.join(dirpath, f), memo_dir=memo_dir) for f in sorted(filenames))
        return entries

    def _source_spec(self, memo_dir: str | Path | None) -> dict[str, Any]:
        return {
            "path": self.path,
            "name": self.name,
            "split": self.split,
            "data_files": self.data_files,
            "data_file_identities": self._data_file_identities(memo_dir),
            "local_folder": self._local_folder_identity(memo_dir),
            "load_kwargs": self.options.load_kwargs,
        }

    def _download_cache_dir(self, cache_dir: str | Path) -> str | None:
        """Where ``datasets`` keeps what it loads: the standard Hugging Face cache (``None``) for
        hub datasets, this package's ``cache_dir/hf_datasets`` for local data (a builder such as
        ``"json"`` or a local folder), so local conversions stay out of the shared cache."""
        if self.path in LOCAL_BUILDERS or (self.path is not None and os.path.isdir(self.path)):
            return str(Path(cache_dir) / DOWNLOAD_FOLDER)
        return None

    def hub_repository(self) -> str | None:
        """``path`` when it names a hub dataset (not a builder such as ``"json"``, not a local folder)."""
        if self.path is None or self.path in LOCAL_BUILDERS or os.path.isdir(self.path) or "://" in self.path:
            return None
        return self.path

    def _load(self, cache_dir: str | Path, streaming: bool, data_files: list[str] | None = None,
              revision: str | None = None) -> datasets.Dataset | datasets.IterableDataset:
        kwargs: dict[str, Any] = dict(self.options.load_kwargs)
        if revision is not None:
            kwargs["revision"] = revision
        kwargs.setdefault("cache_dir", self._download_cache_dir(cache_dir))
        if data_files is not None:
            kwargs["data_files"] = {self.split: list(data_files)}
        elif self._load_data_files() is not None:
            kwargs["data_files"] = self._load_data_files()
        if not streaming and self.options.num_proc is not None:
            kwargs.setdefault("num_proc", self.options.num_proc)
        if streaming:
            kwargs.setdefault("storage_options", self.options.stream_storage_options())
        try:
            dataset = datasets.load_dataset(
                self.path,
                self.name,
                split=self.split,
                streaming=streaming,
                **kwargs,
            )
        except Exception as error:  # noqa: BLE001 - re-raised with the source named
            found = self.input_files().problems_note()
            raise DataSourceError(
                f"{self.source_description}: datasets.load_dataset failed: "
                f"{type(error).__name__}: {error}{error_causes(error)}.{found} Check path/name/split/"
                f"data_files (and the network or HF_HUB_OFFLINE for hub datasets)."
            ) from error
        if isinstance(dataset, (datasets.DatasetDict, datasets.IterableDatasetDict)):
            raise DataSourceError(
                f"{self.source_description}: load_dataset returned several splits "
                f"{list(dataset)}; set split to one of them."
            )
        return dataset
