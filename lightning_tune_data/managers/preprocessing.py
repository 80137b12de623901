"""A source's preprocessing: its preprocess function mapped over the loaded dataset (cached
sources) or lazily over the stream (streaming sources), or pre-tokenized columns taken as they are.

A streaming source has no cache: its first row is read (and preprocessed) at setup, so a wrong
path, a missing column or a broken preprocess function fails there rather than in the middle of
training. Rows whose preprocessing fails later are tagged, never raised inside the stream (that
would end it): the streaming source skips and counts them against the source's
``max_error_count``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import datasets

from lightning_tune_data.keys import INPUT_IDS, LOSS_MASK, PREPROCESS_ERROR
from lightning_tune_data.managers.errors import DataSourceError
from lightning_tune_data.managers.input_files import InputFiles
from lightning_tune_data.managers.options import DEFAULT_PREPROCESS, SourceOptions
from lightning_tune_data.preprocess import PreprocessError
from lightning_tune_data.managers.preprocess_runner import (
    OUTPUT_COLUMNS,
    OUTPUT_FEATURES,
    PROBE_ROWS,
    PreprocessRunner,
    drop_failed_rows,
)
from lightning_tune_data.sources.retries import without_datasets_read_retries
from lightning_tune_data.tokenizers import Tokenizer

__all__ = ["Preprocessing"]

log = logging.getLogger("lightning_tune_data.managers")


class Preprocessing:
    """Runs one source's preprocessing, as its options say.

    Args:
        options: The source's options (preprocess function and kwargs, columns to remove,
            ``num_proc``, ``max_error_count``).
        description: Names the source in messages.
    """

    def __init__(self, options: SourceOptions, description: str) -> None:
        self.options = options
        self.description = description

    @property
    def pretokenized_data(self) -> bool:
        """Whether the data already holds token ids (no preprocess function)."""
        return self.options.preprocess_function is None

    def runner(self, tokenizer: Tokenizer, max_error_count: int = 0) -> PreprocessRunner:
        """The ``Dataset.map`` function that applies the preprocess function.

        Args:
            tokenizer: Passed to the preprocess function.
            max_error_count: Failing rows the runner may tag instead of raising.
        """
        function = self.options.resolve_preprocess_function(self.description)
        assert function is not None
        return PreprocessRunner(
            function, self.options.preprocess_label(), tokenizer, self.options.preprocess_kwargs, self.description,
            max_error_count=max_error_count,
        )

    def removed_columns(self, columns: list[str]) -> list[str]:
        """The columns the map drops: ``columns_to_remove``, or all of ``columns``.

        Args:
            columns: The columns of the loaded data.

        Raises:
            DataSourceError: ``columns_to_remove`` names a column the data does not have.
        """
        if self.options.columns_to_remove is None:
            return list(columns)
        missing = [c for c in self.options.columns_to_remove if c not in columns]
        if missing:
            raise DataSourceError(
                f"{self.description}: columns_to_remove {missing} not found; available "
                f"columns: {columns}. Fix columns_to_remove (or leave it unset to drop all)."
            )
        return list(self.options.columns_to_remove)

    def pretokenized(self, dataset: Any, columns: list[str]) -> Any:
        """The token columns of data that is already tokenized.

        Args:
            dataset: The loaded data (a dataset or a stream).
            columns: Its columns.

        Raises:
            DataSourceError: The data has no ``input_ids`` column.
        """
        if INPUT_IDS not in columns:
            raise DataSourceError(
                f"{self.description}: preprocess_function is None, so the data must hold "
                f"an 'input_ids' column; available columns: {columns}. Set preprocess_function, "
                f"e.g. '{DEFAULT_PREPROCESS}'."
            )
        return dataset.select_columns([c for c in OUTPUT_COLUMNS if c in columns])

    def tokenize(
        self,
        dataset: datasets.Dataset,
        tokenizer: Tokenizer,
        work_dir: Path,
        fingerprint: str,
        input_files: InputFiles,
    ) -> tuple[datasets.Dataset, int]:
        """Preprocess a loaded dataset for its cache.

        A small batch is preprocessed first in this process (a broken function fails fast), then
        the whole dataset by ``Dataset.map`` (``num_proc`` processes). With ``max_error_count``,
        failing rows are counted over the whole dataset and dropped.

        Args:
            dataset: The raw dataset.
            tokenizer: Passed to the preprocess function.
            work_dir: Where the map writes its Arrow file (inside the build's temporary folder).
            fingerprint: The cache's fingerprint (names the map's result for ``datasets``).
            input_files: The source's files, checked first for data Arrow cannot read.

        Returns:
            ``(the token columns, number of rows skipped as failed)``.
        """
        columns = list(dataset.column_names)
        if self.pretokenized_data:
            return self.pretokenized(dataset, columns), 0
        input_files.check_table(dataset, self.description)
        max_error_count = self.options.max_error_count
        runner = self.runner(tokenizer, max_error_count)
        removed = self.removed_columns(columns)
        if len(dataset) == 0:
            log.warning("%s has no rows", self.description)
        else:  # fail fast, in this process, on a small batch
            probe_rows = min(PROBE_ROWS, len(dataset))
            runner(dataset[:probe_rows], list(range(probe_rows)))
            runner.local_errors, runner.first_error = 0, None  # the map counts these rows again
        out_columns = [INPUT_IDS] + ([LOSS_MASK] if runner.has_loss_mask else [])
        kept = [c for c in columns if c not in removed and c not in out_columns]
        tagged = {PREPROCESS_ERROR: datasets.Value("string")} if max_error_count else {}
        features = datasets.Features(
            {**{c: dataset.features[c] for c in kept}, **{c: OUTPUT_FEATURES[c] for c in out_columns},
             **tagged}
        )
        work_dir.mkdir(parents=True, exist_ok=True)
        mapped = dataset.map(
            runner,
            batched=True,
            with_indices=True,
            num_proc=self.options.num_proc,
            remove_columns=removed,
            features=features,
            cache_file_name=str(work_dir / "tokenized.arrow"),
            load_from_cache_file=False,
            new_fingerprint=fingerprint[:32],  # datasets appends a per-process suffix (max 64)
            desc=f"Tokenizing {self.description}",
        )
        skipped = 0
        if max_error_count:
            mapped, skipped = drop_failed_rows(mapped, max_error_count, self.description)
        return mapped.select_columns(out_columns), skipped

    def tokenize_stream(self, dataset: datasets.IterableDataset, tokenizer: Tokenizer) -> datasets.IterableDataset:
        """The lazily preprocessed stream: the token columns plus :data:`PREPROCESS_ERROR` (``None``
        where the row was preprocessed, else why it failed).

        Args:
            dataset: The raw stream.
            tokenizer: Passed to the preprocess function.

        Raises:
            PreprocessError: The first row fails preprocessing and ``max_error_count`` is 0.
        """
        try:
            with without_datasets_read_retries():  # the first row: fail fast, not after 20 x 5 s
                first = next(iter(dataset.take(1)))
        except StopIteration:
            first = None
        columns = list(dataset.column_names or (first.keys() if first is not None else []))
        if self.pretokenized_data:
            return self.pretokenized(dataset, columns)
        runner = self.runner(tokenizer, max_error_count=sys.maxsize)
        removed = self.removed_columns(columns)
        if first is not None:  # fail fast on the first row when nothing may be skipped
            probe = runner({key: [value] for key, value in first.items()}, [0])
            runner.local_errors = 0
            if probe[PREPROCESS_ERROR][0] is not None and not self.options.max_error_count:
                raise PreprocessError(probe[PREPROCESS_ERROR][0])
        out_columns = [INPUT_IDS] + ([LOSS_MASK] if runner.has_loss_mask else []) + [PREPROCESS_ERROR]
        mapped = dataset.map(runner, batched=True, with_indices=True, remove_columns=removed)
        return mapped.select_columns(out_columns)
