"""Preprocessing steps of a manager: tokenize a loaded dataset with the preprocessing runner
(cached sources) or lazily (streaming sources), or take pre-tokenized data as it is."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import datasets

from lightning_tune_data.managers.config import DEFAULT_PREPROCESS, DataSourceError
from lightning_tune_data.preprocess import PreprocessError
from lightning_tune_data.managers.preprocess_runner import (
    _ERROR_COLUMN,
    _OUTPUT_FEATURES,
    _PROBE_ROWS,
    OUTPUT_COLUMNS,
    _PreprocessRunner,
    drop_failed_rows,
)
from lightning_tune_data.sources.retries import without_datasets_read_retries
from lightning_tune_data.tokenizers import Tokenizer

log = logging.getLogger("lightning_tune_data.managers")


class PreprocessingSteps:
    """Mixin of :class:`~lightning_tune_data.managers.DatasetManager`: runs its preprocessing."""

    def _runner(self, tokenizer: Tokenizer, max_error_count: int = 0) -> _PreprocessRunner:
        fn = self.preprocess_fn
        assert fn is not None
        return _PreprocessRunner(
            fn, self._preprocess_label(), tokenizer, self.preprocess_kwargs, self.source_description,
            max_error_count=max_error_count,
        )

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
        kept, self._skipped_rows = drop_failed_rows(mapped, self.max_error_count, self.source_description)
        return kept

    def _setup_streaming(self, tokenizer: Tokenizer, cache_dir: str | Path) -> datasets.IterableDataset:
        dataset = self._load(cache_dir, streaming=True)
        try:
            with without_datasets_read_retries():  # the first row: fail fast, not after 20 x 5 s
                first = next(iter(dataset.take(1)))
        except StopIteration:
            first = None
        columns = list(dataset.column_names or (first.keys() if first is not None else []))
        if self.preprocess_function is None:
            return self._pretokenized(dataset, columns)
        # Rows whose preprocessing fails are never raised inside the stream (that would end
        # it): they are tagged, and the streaming source skips and counts them against this
        # source's max_error_count, like any other unreadable row.
        runner = self._runner(tokenizer, max_error_count=sys.maxsize)
        removed = self._removed_columns(columns)
        if first is not None:  # fail fast on the first row when nothing may be skipped
            probe = runner({key: [value] for key, value in first.items()}, [0])
            runner.local_errors = 0
            if probe[_ERROR_COLUMN][0] is not None and not self.max_error_count:
                raise PreprocessError(probe[_ERROR_COLUMN][0])
        out_columns = ["input_ids"] + (["loss_mask"] if runner.has_loss_mask else []) + [_ERROR_COLUMN]
        mapped = dataset.map(runner, batched=True, with_indices=True, remove_columns=removed)
        return mapped.select_columns(out_columns)
