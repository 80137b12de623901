"""What a source's cache build does inside its folder: load (its task's part of) the raw data,
preprocess it, check that every token id fits the tokenizer, and write the shards of the store.

The folder itself (its lock, checksums, marker and the rename into place) is
:func:`lightning_tune_data.cache.store.build_cache_atomically`'s; this is the ``build`` it calls.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lightning_tune_data.cache.root import DEFAULT_SHARD_BYTES
from lightning_tune_data.cache.tasks import TaskManifest, write_task
from lightning_tune_data.keys import INPUT_IDS
from lightning_tune_data.managers.input_files import InputFiles
from lightning_tune_data.managers.preprocessing import Preprocessing
from lightning_tune_data.preprocess import PreprocessError
from lightning_tune_data.tokenizers import Tokenizer

__all__ = ["CacheBuild", "arrow_table", "check_token_ids", "progress_bars_off"]


@contextlib.contextmanager
def progress_bars_off() -> Iterator[None]:
    """Hide ``datasets``' progress bars for a step (restoring the user's setting afterwards)."""
    enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if enabled:
            datasets.enable_progress_bars()


def check_token_ids(dataset: datasets.Dataset, vocab_size: int, tokenizer: Any, description: str) -> None:
    """Fail when a token id is negative or not below ``vocab_size`` (one pass over the column).

    Args:
        dataset: The freshly preprocessed dataset (its ``input_ids`` column).
        vocab_size: Every id must be below it.
        tokenizer: Named in the error.
        description: Names the source in the error.

    Raises:
        PreprocessError: Naming the id, its row and the tokenizer.
    """
    column = dataset.data.table.column(INPUT_IDS)
    values = pc.list_flatten(column) if isinstance(column.type, (pa.ListType, pa.LargeListType)) else column
    if len(values) == 0:
        return
    bounds = pc.min_max(values)
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is None:
        return
    if high < vocab_size and low >= 0:
        return
    bad = high if high >= vocab_size else low
    position = pc.index(values, bad).as_py()  # first occurrence, in the flattened ids
    lengths = np.asarray(pc.list_value_length(column).fill_null(0), dtype=np.int64)
    row = int(np.searchsorted(np.cumsum(lengths), position, side="right"))
    raise PreprocessError(
        f"{description}: token id {bad} (row {row}) is outside the tokenizer's vocabulary "
        f"(vocab_size={vocab_size}, tokenizer {tokenizer!r}); the model's embedding would fail on it. "
        f"Use the tokenizer that produced these ids, or fix the preprocess function / the pre-tokenized data."
    )


class CacheBuild:
    """Fills a folder with one task's part of a source's token store.

    The task reads its part of the inputs, preprocesses it, checks the token ids and writes its
    shards, then its task manifest and its done-marker (see :mod:`lightning_tune_data.cache.tasks`).
    With one task (``prepare_data``), the part is the whole source.

    Args:
        load: Loads the task's part of the raw dataset (not streaming), keeping ``datasets``'
            intermediate files (Arrow conversions of local data files) under the folder it is given,
            which is removed when the task is written; returns the rows and a description of the
            part (recorded in the task manifest).
        preprocessing: The source's preprocessing.
        input_files: Lists the source's local files when the build runs (empty ones are warned
            about; they name problems in the data).
        tokenizer: Passed to the preprocess function; its ``vocab_size`` bounds the token ids.
        fingerprint: The store's fingerprint.
        task_index, num_tasks: Which task this is.
        shard_bytes: A shard is closed once it holds about this many bytes.
        store_inputs: What the whole store is built from, recorded in the task manifest.
    """

    def __init__(
        self,
        load: Callable[[Path], tuple[datasets.Dataset, dict[str, Any]]],
        preprocessing: Preprocessing,
        input_files: Callable[[], InputFiles],
        tokenizer: Tokenizer,
        fingerprint: str,
        task_index: int = 0,
        num_tasks: int = 1,
        shard_bytes: int = DEFAULT_SHARD_BYTES,
        store_inputs: dict[str, Any] | None = None,
    ) -> None:
        self.load = load
        self.preprocessing = preprocessing
        self.input_files = input_files
        self.tokenizer = tokenizer
        self.fingerprint = fingerprint
        self.task_index = task_index
        self.num_tasks = num_tasks
        self.shard_bytes = shard_bytes
        self.store_inputs = dict(store_inputs or {})

    def __call__(self, temp_dir: Path) -> TaskManifest:
        """Fill ``temp_dir`` with the task's shards, manifest and done-marker.

        Raises:
            PreprocessError: Preprocessing failed, a token id is out of the vocabulary, or (with
                one task) no rows are left.
        """
        description = self.preprocessing.description
        input_files = self.input_files()
        if self.task_index == 0:
            input_files.warn_empty(description)
        work_dir = temp_dir / "_work"  # removed when the task is written, with datasets' conversions in it
        with progress_bars_off():  # one bar per source: the tokenization's
            dataset, part = self.load(work_dir)
        processed, skipped_rows = self.preprocessing.tokenize(
            dataset, self.tokenizer, work_dir, self.fingerprint, input_files
        )
        check_token_ids(processed, self.tokenizer.vocab_size, self.tokenizer, description)
        if len(processed) == 0 and self.num_tasks == 1:
            raise PreprocessError(
                f"{description}: no rows left after preprocessing ({len(dataset)} rows read, "
                f"{skipped_rows} skipped as failed). Check the data files and what "
                f"preprocess_function {self.preprocessing.options.preprocess_label()} filters out."
            )
        table = arrow_table(processed)
        manifest = write_task(temp_dir, table, self.fingerprint, self.task_index, self.num_tasks, part, len(dataset),
                              skipped_rows, self.shard_bytes, self.store_inputs)
        del processed, dataset, table
        shutil.rmtree(work_dir, ignore_errors=True)
        return manifest


def arrow_table(dataset: datasets.Dataset) -> pa.Table:
    """The rows of a ``datasets.Dataset`` as one Arrow table (an indices mapping applied)."""
    if getattr(dataset, "_indices", None) is not None:
        dataset = dataset.flatten_indices()
    return dataset.data.table
