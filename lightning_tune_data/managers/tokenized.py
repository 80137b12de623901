"""``TokenizedDatasetManager``: train on a corpus that is already tokenized, read in place.

No raw inputs, no preprocess function, no conversion: ``path`` points at one of our committed
stores (the folder ``lightning-tune-data prepare`` wrote, local or by URL) or at the files of
another tool's format (Megatron, datatrove, Dolma, nanoGPT, llm.c, LitData, MDS; see
:mod:`lightning_tune_data.formats`). ``prepare_data`` copies remote files to this node (once) and
works out what a format without an index needs (its document boundaries, kept); ``setup`` opens
the corpus from metadata on every rank. A remote train corpus larger than its share of the
node's ``cache_budget`` is not copied: it is read by byte ranges through the node's shard cache
(:mod:`lightning_tune_data.formats.ranged`); with a budget, the shards that must be decoded (remote
MDS shards and LitData items with size headers; local MDS shards that cannot be read in place)
are units of that cache, decoded when fetched.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lightning_tune_data.cache.checksums import VerifyMode
from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.formats.files import CorpusFiles
from lightning_tune_data.formats.options import FormatOptions
from lightning_tune_data.formats.ranged import ranged_corpus
from lightning_tune_data.formats.reading import open_corpus
from lightning_tune_data.formats.store import open_committed_store, store_files_at
from lightning_tune_data.keys import (
    INPUT_IDS,
    LOSS_MASK,
    TOKEN_DTYPES,
    TOKENIZED_FORMATS,
    TokenDtype,
    TokenizedFormat,
)
from lightning_tune_data.managers.errors import DataSourceError
from lightning_tune_data.managers.hub import DatasetManager
from lightning_tune_data.managers.options import SourceOptions
from lightning_tune_data.tokenizers import ByteTokenizer, Tokenizer

__all__ = ["AppendEos", "TokenizedDatasetManager"]


class AppendEos:
    """A sample transform that ends a document with ``eos_id`` unless it already ends with it.

    Args:
        eos_id: the id appended.
        then: a transform applied before (the user's ``output_transform``), or ``None``.
    """

    def __init__(self, eos_id: int, then: Callable[[dict], dict] | None = None) -> None:
        self.eos_id = int(eos_id)
        self.then = then

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        if self.then is not None:
            sample = self.then(sample)
        ids = sample[INPUT_IDS]
        if len(ids) == 0 or int(ids[-1]) != self.eos_id:
            sample = dict(sample)
            sample[INPUT_IDS] = np.append(np.asarray(ids), np.array(self.eos_id, dtype=np.asarray(ids).dtype))
            if LOSS_MASK in sample:
                sample[LOSS_MASK] = np.append(np.asarray(sample[LOSS_MASK], dtype=bool), True)
        return sample


class TokenizedDatasetManager(DatasetManager):
    """A tokenized corpus read in place: one of our committed stores, or another tool's files.

    Args:
        path: a local folder, file or glob, or an fsspec URL (``s3://bucket/corpus/``): the store
            folder ``prepare`` wrote, or the corpus's files.
        format: ``"auto"`` (detected from the files), ``"lightning_tune_data"`` (our store),
            ``"megatron"``, ``"datatrove"``, ``"dolma"``, ``"nanogpt"``, ``"llmc"``, ``"litdata"``
            or ``"mds"``.
        storage_options: options of the URL's filesystem (default: the datamodule's).
        dtype: the token dtype where the format does not record it (Dolma, nanoGPT: default
            ``uint16``; the dolma2 tokenizer writes ``uint32``).
        eos_id: the delimiter of formats without an index: the id ending each document (Dolma,
            nanoGPT) or starting it (llm.c). Default: the tokenizer's EOS (llm.c: its BOS), when
            the datamodule was given a tokenizer other than the byte tokenizer.
        append_eos: end every document with ``eos_id`` unless it already ends with it (never a
            second one). Off by default: the formats' writers already end documents with EOS.
        vocab_size: ids must be below it (default: the tokenizer's, when one was given); checked
            at setup for the formats that scan their ids.
        column: the MDS column of ids (default ``tokens`` or ``input_ids``).
        weight, stages, shuffle, max_error_count, message_transform, model_transform,
        output_transform, filter_fn, filter_kwargs: as for :class:`DatasetManager`.
        max_epochs, max_tokens: caps on this train source (passes at most, fractional allowed;
            tokens at most, a number or ``"30B"``); ``None``: no cap.

    Raises:
        DataSourceError: an unknown format or dtype.
    """

    def __init__(
        self,
        path: str,
        format: TokenizedFormat = "auto",
        storage_options: dict[str, Any] | None = None,
        dtype: TokenDtype | None = None,
        eos_id: int | None = None,
        append_eos: bool = False,
        vocab_size: int | None = None,
        column: str | None = None,
        weight: float = 1.0,
        stages: list[str] | None = None,
        shuffle: bool = True,
        max_error_count: int = 0,
        message_transform: str | Callable | None = None,
        model_transform: str | Callable | None = None,
        output_transform: str | Callable | None = None,
        filter_fn: str | Callable | None = None,
        filter_kwargs: dict | None = None,
        max_epochs: float | None = None,
        max_tokens: int | str | None = None,
    ) -> None:
        self.full_name = None
        self.path = str(path)
        self.name = None
        self.split = "train"
        self.data_files = None
        self.source_name: str | None = None
        self.format = format
        if format not in TOKENIZED_FORMATS:
            raise DataSourceError(f"{self.source_description}: format {format!r} is not one of {list(TOKENIZED_FORMATS)}.")
        if dtype is not None and dtype not in TOKEN_DTYPES:
            raise DataSourceError(f"{self.source_description}: dtype {dtype!r} is not one of {list(TOKEN_DTYPES)}.")
        self.storage_options = storage_options
        self.dtype = dtype
        self.eos_id = eos_id
        self.append_eos = bool(append_eos)
        self.vocab_size = vocab_size
        self.column = column
        arguments = {**locals(), "preprocess_function": None, "preprocess_kwargs": None, "columns_to_remove": None,
                     "streaming": False, "num_proc": None, "load_kwargs": None, "stream_retries": None,
                     "cache_dir": None}
        self.options = SourceOptions.from_arguments(self.source_description, arguments)

    def _source_label(self) -> str:
        return f"path={self.path!r}, format={self.format!r}"

    def _cache_stem(self) -> str:
        return Path(self.path.rstrip("/")).name or "tokenized"

    def _source_spec(self, memo_dir: str | Path | None) -> dict[str, Any]:
        return {"path": self.path, "format": self.format}

    def _local_data_files(self) -> list[str]:
        return []

    def _load(self, cache_dir: str | Path, streaming: bool, data_files: list[str] | None = None) -> Any:
        raise DataSourceError(f"{self.source_description} is read in place; it has nothing to load or preprocess.")

    def cache_dir_for(self, tokenizer: Tokenizer, cache_dir: str | Path | StoreRoot) -> Path:
        """Not applicable: a tokenized corpus is read where it is.

        Args:
            tokenizer: unused.
            cache_dir: unused.
        """
        raise DataSourceError(f"{self.source_description} is read in place; it has no cache of its own.")

    # ------------------------------------------------------------------ reading

    def _tokenizer_given(self, tokenizer: Tokenizer | None) -> Tokenizer | None:
        """The tokenizer, unless it is the datamodule's default byte tokenizer (never assumed here)."""
        return None if tokenizer is None or isinstance(tokenizer, ByteTokenizer) else tokenizer

    def format_options(self, tokenizer: Tokenizer | None, root: StoreRoot) -> FormatOptions:
        """What the format readers need: delimiter, dtype, vocabulary and this node's folder.

        Args:
            tokenizer: the datamodule's tokenizer (the byte tokenizer counts as none).
            root: the datamodule's cache root (its local folder keeps scans and copies).
        """
        given = self._tokenizer_given(tokenizer)
        eos = self.eos_id
        if eos is None and given is not None:
            eos = given.bos_id if self.format == "llmc" else given.eos_id
        vocab = self.vocab_size if self.vocab_size is not None else (given.vocab_size if given is not None else None)
        return FormatOptions(self.source_description, root.local_dir, self.dtype, eos, vocab, self.column)

    def open(self, tokenizer: Tokenizer | None, cache_dir: str | Path | StoreRoot, verify_mode: VerifyMode = "checksum") -> Any:
        """The corpus, opened from its metadata (remote files are copied to this node first, or read
        by byte ranges when the corpus is larger than its share of ``cache_budget``).

        Args:
            tokenizer: the datamodule's tokenizer.
            cache_dir: the datamodule's cache root.
            verify_mode: how a remote store's local copy is checked.
        """
        root = StoreRoot.of(cache_dir)
        if self.format == "lightning_tune_data" or self._is_store(root):
            files = store_files_at(self.path, root, self.storage_options)
            return open_committed_store(files, tokenizer, self.source_description, verify_mode)
        options = self.format_options(tokenizer, root)
        storage = self.storage_options if self.storage_options is not None else root.storage_options
        share = root.budget_share if root.cache_budget is not None else None
        files = CorpusFiles(self.path, storage, root.local_dir, self.source_description, budget_share=share)
        try:
            corpus = open_corpus(files, self.format, options)
        except (ValueError, FileNotFoundError) as error:
            raise DataSourceError(str(error)) from None
        decoded = any(entry.decoder is not None for entry in corpus.files)  # shards decoded into the node cache
        return ranged_corpus(corpus, files, root) if files.ranged or decoded else corpus

    def _is_store(self, root: StoreRoot) -> bool:
        if self.format != "auto":
            return False
        return store_files_at(self.path, root, self.storage_options).exists("_COMPLETE.json")

    def prepare_data(self, tokenizer: Tokenizer, cache_dir: str | Path | StoreRoot,
                     cache_verify: VerifyMode = "checksum") -> Path | None:
        """Copy remote files to this node and keep what the format needs (once per node).

        Args:
            tokenizer: the datamodule's tokenizer.
            cache_dir: the datamodule's cache root.
            cache_verify: how a remote store's local copy is checked.
        """
        self.open(tokenizer, cache_dir, cache_verify)
        return None

    def setup(self, tokenizer: Tokenizer, cache_dir: str | Path | StoreRoot) -> Any:
        """The corpus on this rank (a ``TokenCorpus``, or one of our stores as a dataset).

        Args:
            tokenizer: the datamodule's tokenizer.
            cache_dir: the datamodule's cache root.
        """
        return self.open(tokenizer, cache_dir)

    def stream_transforms(self) -> dict[str, Any]:
        """The user's transforms, with ``append_eos``'s last (it needs an EOS id)."""
        transforms = super().stream_transforms()
        if self.append_eos:
            eos = self.eos_id
            if eos is None:
                raise DataSourceError(f"{self.source_description}: append_eos needs eos_id (the id to append).")
            transforms["output_transform"] = AppendEos(eos, transforms.get("output_transform"))
        return transforms

    def __repr__(self) -> str:
        return f"TokenizedDatasetManager(path={self.path!r}, format={self.format!r}, weight={self.weight})"
