"""The manager base class: a source's data and options, its cache fingerprint, and the cache
lifecycle (``prepare_data`` builds the cache once per node, ``setup`` opens it on every rank).

Managers hold only configuration (no open files, no datasets), so they pickle into dataloader
workers. ``source_name`` (the dataloader/metric name, set by the datamodule) is used in messages.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import datasets

from lightning_tune_data.cache.checksums import VerifyMode
from lightning_tune_data.cache.fingerprints import fingerprint as fingerprint_of
from lightning_tune_data.cache.layout import safe_name
from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.managers.cache_build import CacheBuild
from lightning_tune_data.managers.input_files import InputFiles
from lightning_tune_data.managers.options import SourceOptions
from lightning_tune_data.managers.preprocessing import Preprocessing
from lightning_tune_data.managers.source_cache import SourceCache
from lightning_tune_data.managers.task_inputs import task_part
from lightning_tune_data.tokenizers import Tokenizer
from lightning_tune_data.version import __version__

__all__ = ["SourceManager", "option_attribute"]


def option_attribute(field: str, doc: str) -> property:
    """A manager attribute that reads and writes ``field`` of its frozen ``options``.

    Setting it replaces the options object with a copy, so options shared elsewhere never change.

    Args:
        field: the :class:`SourceOptions` field.
        doc: the attribute's docstring.
    """

    def read(manager: SourceManager) -> Any:
        return getattr(manager.options, field)

    def write(manager: SourceManager, value: Any) -> None:
        manager.options = dataclasses.replace(manager.options, **{field: value})

    return property(read, write, doc=doc)


class SourceManager(ABC):
    """Options, fingerprint and cache lifecycle shared by every dataset manager.

    Subclasses set the source fields (``full_name``, ``path``, ``name``, ``split``,
    ``data_files``, ``source_name``) and ``options``, and say how their data is described
    (``_source_label``), keyed (``_source_spec``, ``_cache_stem``), found (``_local_data_files``)
    and loaded (``_load``).
    """

    full_name: str | None
    path: str | None
    name: str | None
    split: str | None
    data_files: Any
    source_name: str | None
    options: SourceOptions

    # ------------------------------------------------------------------ options the datamodule reads

    weight = option_attribute("weight", "Relative sampling weight among the train sources (the datamodule checks it).")
    stages = option_attribute("stages", "Trainer stages this source is used in.")
    streaming = option_attribute("streaming", "Whether the source is streamed and tokenized lazily (no cache).")
    shuffle = option_attribute("shuffle", "Whether the training stream shuffles this source.")
    max_epochs = option_attribute("max_epochs", "Most passes over this source a train run takes (None: no cap).")
    max_tokens = option_attribute("max_tokens", "Most tokens a train run takes from this source (None: no cap).")
    max_error_count = option_attribute(
        "max_error_count", "Failing rows or samples that may be skipped (and counted) before raising.")

    def stream_options(self) -> dict[str, float]:
        """Retry bounds a streaming source reads with (``HFStreamingSource`` keyword arguments)."""
        return self.options.stream_options()

    def stream_transforms(self) -> dict[str, Any]:
        """Per-sample transforms and filter for this source's train stream.

        They run on each document sample (``input_ids``, ``loss_mask``, ``source``, ``epoch``)
        as it is streamed, after the cached preprocessing; failures count against
        ``max_error_count``.
        """
        return self.options.stream_transforms(self.source_description)

    # ------------------------------------------------------------------ description / identity

    @abstractmethod
    def _source_label(self) -> str:
        """The source's data in a few words (``path='...', split='...'``), for messages."""

    @property
    def source_description(self) -> str:
        """``source '<name>' (<spec>)`` for messages; the name is set by the datamodule."""
        label = self._source_label()
        return f"source '{self.source_name}' ({label})" if self.source_name else f"source {label}"

    @abstractmethod
    def _source_spec(self, memo_dir: str | Path | None) -> dict[str, Any]:
        """The fingerprint part that identifies the data (data files count by their content;
        their hashes are remembered in ``memo_dir``)."""

    @abstractmethod
    def _cache_stem(self) -> str:
        """Folder-name prefix of the source's caches when it has no ``source_name``."""

    def fingerprint_parts(self, tokenizer: Tokenizer, cache_dir: str | Path | None = None) -> dict[str, Any]:
        """Everything that changes the preprocessed content of this source, hashed by :meth:`fingerprint`.

        Args:
            tokenizer: The tokenizer whose ``identity`` is part of the key.
            cache_dir: The cache root, where content hashes of data files are remembered.
        """
        function = self.options.resolve_preprocess_function(self.source_description)
        return {
            "manager": type(self).__name__,
            "source": self._source_spec(cache_dir),
            "preprocess": self.options.preprocess_identity(function),
            "tokenizer": tokenizer.identity,
        }

    def fingerprint(self, tokenizer: Tokenizer, cache_dir: str | Path | None = None) -> str:
        """Hash of everything that changes the preprocessed content of this source.

        Data files count by their content (not their modification time).

        Args:
            tokenizer: The tokenizer whose ``identity`` is part of the key.
            cache_dir: The cache root, where content hashes of data files are remembered.
        """
        return fingerprint_of(self.fingerprint_parts(tokenizer, cache_dir))

    def cache_key(self) -> str:
        """Folder-name prefix of this source's caches: the source name, else the data's name."""
        return safe_name(self.source_name) if self.source_name else self._cache_stem()

    def _cache(self, cache_dir: str | Path | StoreRoot, source_fingerprint: str) -> SourceCache:
        return SourceCache(cache_dir, self.cache_key(), source_fingerprint, type(self).__name__,
                           self.source_description)

    def cache_dir_for(self, tokenizer: Tokenizer, cache_dir: str | Path | StoreRoot) -> Path:
        """Directory of this source's cache: ``cache_dir/<source name>-<fingerprint[:16]>``.

        A complete cache with the same fingerprint under another name (e.g. built before the
        source was renamed) is used instead of building a second one.

        Args:
            tokenizer: The tokenizer (part of the fingerprint).
            cache_dir: The root cache directory.
        """
        root = StoreRoot.of(cache_dir)
        return self._cache(root, self.fingerprint(tokenizer, root.local_dir)).folder()

    # ---------------------------------------------------------------------------- lifecycle

    @abstractmethod
    def _local_data_files(self) -> list[str]:
        """The data files that are local paths (remote URLs and hub files are left out)."""

    @abstractmethod
    def _load(self, cache_dir: str | Path, streaming: bool, data_files: list[str] | None = None,
              revision: str | None = None) -> datasets.Dataset | datasets.IterableDataset:
        """Load the raw source (``streaming``: as a ``datasets.IterableDataset``; ``data_files``:
        only these of its files; ``revision``: this hub commit)."""

    def hub_repository(self) -> str | None:
        """The hub dataset (``owner/dataset``) this source reads, whose commit the tasks of a
        store pin; ``None`` for local data."""
        return None

    def input_files(self) -> InputFiles:
        """The source's local data files, for checks and error messages."""
        return InputFiles(self._local_data_files(), self.path, self.options.load_kwargs)

    def preprocessing(self) -> Preprocessing:
        """The source's preprocessing, naming the source as it is described now."""
        return Preprocessing(self.options, self.source_description)

    def _task_files(self) -> list[str] | None:
        """The data files a multi-task build may split by (whole files per task), or ``None``."""
        return None

    def load_task(self, cache_dir: str | Path | StoreRoot, task_index: int, num_tasks: int,
                  revision: str | None = None) -> tuple[Any, dict[str, Any]]:
        """Load task ``task_index`` of ``num_tasks``'s part of the raw source (see
        :mod:`lightning_tune_data.managers.task_inputs`).

        Args:
            cache_dir: The cache root, or a local folder (``datasets``' conversions of local data
                files go into its node-local folder; a task passes its work folder, removed when
                it is written).
            task_index, num_tasks: The task.
            revision: The hub commit to read (recorded in the part), ``None``: as configured.

        Returns:
            ``(the part's rows, a description of the part)``.
        """
        local_dir = StoreRoot.of(cache_dir).local_dir
        rows, part = task_part(self._task_files(), task_index, num_tasks,
                               lambda files: self._load(local_dir, streaming=False, data_files=files,
                                                        revision=revision))
        return rows, (dict(part, revision=revision) if revision is not None else part)

    def store_task(
        self, tokenizer: Tokenizer, cache_dir: str | Path | StoreRoot, task_index: int = 0, num_tasks: int = 1,
        revision: str | None = None,
    ) -> tuple[SourceCache, CacheBuild, dict[str, Any]]:
        """The store of this source, the build of one task of it, and what the store is built from.

        Args:
            tokenizer: Tokenizer passed to the preprocess function (and keyed into the store).
            cache_dir: The cache root.
            task_index, num_tasks: The task.
            revision: The hub commit the task reads (``None``: as configured).
        """
        root = StoreRoot.of(cache_dir)
        parts = self.fingerprint_parts(tokenizer, root.local_dir)
        cache = self._cache(root, fingerprint_of(parts))
        inputs = {"source_key": cache.key, "source_name": self.source_name,
                  "package_version": __version__, "parts": parts}
        build = CacheBuild(lambda work_dir: self.load_task(work_dir, task_index, num_tasks, revision),
                           self.preprocessing(),
                           self.input_files, tokenizer, cache.fingerprint, task_index, num_tasks, root.shard_bytes,
                           inputs)
        return cache, build, inputs

    def prepare_data(
        self, tokenizer: Tokenizer, cache_dir: str | Path | StoreRoot, cache_verify: VerifyMode = "checksum"
    ) -> Path | None:
        """Download, preprocess and store this source (once per node); reuse a committed store.

        A reused local store is checked first: with ``cache_verify="checksum"`` every file whose
        size, modification time or inode changed since it was last verified is hashed again and
        compared with the checksum recorded when it was written (a corrupt store is rebuilt with a
        warning naming the file); ``"full"`` hashes every file; ``"size"`` compares sizes only.
        With a remote ``cache_dir`` (``s3://...``), a committed store is downloaded to this node
        (verified) or, when there is none, built here and uploaded. Reuse needs no write access;
        a build in a directory that cannot be written fails naming it.

        Args:
            tokenizer: Tokenizer passed to the preprocess function (and keyed into the store).
            cache_dir: Root cache directory (local path, URL or :class:`StoreRoot`).
            cache_verify: ``"checksum"`` (default), ``"full"`` or ``"size"``.

        Returns:
            This node's store folder, or ``None`` for streaming sources (nothing is stored).
        """
        if self.streaming:
            return None
        cache, build, inputs = self.store_task(tokenizer, cache_dir)
        return cache.build(build, inputs, cache_verify)

    def setup(
        self, tokenizer: Tokenizer, cache_dir: str | Path | StoreRoot
    ) -> datasets.Dataset | datasets.IterableDataset:
        """Load this source on the current rank.

        Args:
            tokenizer: The tokenizer used by ``prepare_data`` (its identity selects the store).
            cache_dir: Root cache directory given to ``prepare_data``.

        Returns:
            The memory-mapped ``datasets.Dataset`` (columns ``input_ids`` [+ ``loss_mask``]),
            or for ``streaming=True`` a ``datasets.IterableDataset`` tokenized lazily.

        Raises:
            CacheMissingError: No committed store for this configuration: run ``prepare_data`` first.
        """
        root = StoreRoot.of(cache_dir)
        if self.streaming:
            return self.preprocessing().tokenize_stream(self._load(root.local_dir, streaming=True), tokenizer)
        cache, _, inputs = self.store_task(tokenizer, root)
        return cache.open(inputs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._source_label()}, weight={self.weight}, stages={self.stages})"
