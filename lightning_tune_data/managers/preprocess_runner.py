"""The preprocessing runner: applies a source's preprocess function inside ``Dataset.map``.

It checks what the function returns (an ``input_ids`` column, optionally a ``loss_mask`` of the same
shape), turns failures into errors that name the source, rows and column, and implements the error
budget: with ``max_error_count > 0`` failing rows are tagged instead of raised, counted over the
whole dataset after the map, and dropped (or the build fails once the budget is exceeded).
"""

from __future__ import annotations

import difflib
import inspect
import traceback
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import datasets
import numpy as np

from lightning_tune_data.keys import INPUT_IDS, LOSS_MASK, PREPROCESS_ERROR
from lightning_tune_data.preprocess import MissingColumnError, PreprocessError, RowError
from lightning_tune_data.tokenizers import Tokenizer

__all__ = ["OUTPUT_COLUMNS", "OUTPUT_FEATURES", "PROBE_ROWS", "PreprocessRunner", "drop_failed_rows"]

#: Columns a preprocessed cache keeps.
OUTPUT_COLUMNS = (INPUT_IDS, LOSS_MASK)
#: Their Arrow types in the cache.
OUTPUT_FEATURES = {
    INPUT_IDS: datasets.List(datasets.Value("int32")),
    LOSS_MASK: datasets.List(datasets.Value("bool")),
}
#: Rows preprocessed first, in the building process, so a broken function fails fast.
PROBE_ROWS = 8


class PreprocessRunner:
    """Picklable ``Dataset.map`` function: runs the preprocess function, checks and tags errors.

    Args:
        fn: The preprocess function ``fn(examples, tokenizer, **kwargs)``.
        fn_label: How messages name it (``'module.function'``).
        tokenizer: Passed to ``fn``.
        kwargs: Extra keyword arguments of ``fn``.
        description: Names the source in messages.
        max_error_count: Failing rows this process may tag (and the map skip) before raising.
    """

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
        # With a budget, failing rows are not raised but tagged in PREPROCESS_ERROR (one placeholder
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
        close = difflib.get_close_matches(column, available, n=1)
        fix = (
            f"Did you mean '{close[0]}'? Set preprocess_kwargs: {{{kwarg}: {close[0]}}}"
            if kwarg and close
            else f"Set preprocess_kwargs: {{{kwarg}: <one of {available}>}}"
            if kwarg
            else "Rename the column in the data or use a preprocess_function that reads one of "
            "the available columns"
        )
        return (
            f"{self.description}: column '{column}' not found (needed by preprocess_function "
            f"{self.fn_label}); available columns: {available}. {fix}."
        )

    def __call__(self, examples: dict[str, list], indices: list[int]) -> dict[str, list]:
        """Preprocess one batch of rows (``indices``: their rows in the dataset)."""
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
            result[PREPROCESS_ERROR] = [None] * len(result[INPUT_IDS])
        return result

    def _missing_column_error(self, error: MissingColumnError, examples: dict[str, list]) -> PreprocessError:
        return PreprocessError(self._missing_column(error.column, list(examples), error.kwarg))

    def _row_error(self, error: RowError, indices: list[int]) -> str:
        index = indices[error.row] if 0 <= error.row < len(indices) else error.row
        return (
            f"{self.description}: row {index}, column '{error.column}': {error.problem} "
            f"(preprocess_function {self.fn_label}). Fix or drop that row in the data{self._budget_hint()}."
        )

    def _budget_hint(self) -> str:
        if self.max_error_count:
            return ""
        return ", or set max_error_count: N on this source to skip (and count) up to N failing rows"

    def _row_by_row(self, examples: dict[str, list], indices: list[int]) -> dict[str, list]:
        """Re-run a failed batch one row at a time; tag the rows that fail (error budget mode)."""
        num_rows = len(next(iter(examples.values()))) if examples else 0
        merged: dict[str, list] = {INPUT_IDS: [], PREPROCESS_ERROR: []}
        if self.has_loss_mask:
            merged[LOSS_MASK] = []
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
                merged[INPUT_IDS].append([])
                if LOSS_MASK in merged:
                    merged[LOSS_MASK].append([])
                merged[PREPROCESS_ERROR].append(message)
                continue
            result = self._check(output, f"row {index}")
            if LOSS_MASK in result and LOSS_MASK not in merged:
                merged[LOSS_MASK] = [[] for _ in merged[INPUT_IDS]]
            merged[INPUT_IDS].extend(result[INPUT_IDS])
            if LOSS_MASK in merged:
                merged[LOSS_MASK].extend(result.get(LOSS_MASK, []))
            merged[PREPROCESS_ERROR].extend([None] * len(result[INPUT_IDS]))
        return merged

    def _failure(self, rows: str, error: BaseException) -> PreprocessError:
        trace = "".join(traceback.format_exception(error)).rstrip()
        return PreprocessError(
            f"{self.description}: preprocess_function {self.fn_label} failed on {rows}: "
            f"{type(error).__name__}: {error}{self._budget_hint().replace(', or set', '. To skip such rows, set', 1)}"
            f"{'.' if self._budget_hint() else ''}\n{trace}"
        )

    def _check(self, output: Any, rows: str) -> dict[str, list]:
        if not isinstance(output, Mapping) or INPUT_IDS not in output:
            got = sorted(output) if isinstance(output, Mapping) else type(output).__name__
            raise PreprocessError(
                f"{self.description}: preprocess_function {self.fn_label} returned {got} for "
                f"{rows}; it must return a dict with an 'input_ids' column (list of token-id "
                f"lists), optionally 'loss_mask'."
            )
        result = {key: output[key] for key in OUTPUT_COLUMNS if key in output}
        has_mask = LOSS_MASK in result
        if self.has_loss_mask is None:
            self.has_loss_mask = has_mask
        elif has_mask != self.has_loss_mask:
            raise PreprocessError(
                f"{self.description}: preprocess_function {self.fn_label} returned 'loss_mask' "
                f"for some batches but not others ({rows}); return it for every batch or never."
            )
        if has_mask:
            ids, masks = result[INPUT_IDS], result[LOSS_MASK]
            if len(ids) != len(masks) or any(len(a) != len(b) for a, b in zip(ids, masks)):
                raise PreprocessError(
                    f"{self.description}: preprocess_function {self.fn_label} returned "
                    f"'loss_mask' rows whose lengths differ from 'input_ids' ({rows}); they must "
                    f"match token for token."
                )
        return result


def drop_failed_rows(
    mapped: datasets.Dataset, max_error_count: int, description: str
) -> tuple[datasets.Dataset, int]:
    """Count the rows tagged as failed over the whole dataset; raise past the budget, else drop them.

    Args:
        mapped: The dataset the runner mapped, with its :data:`PREPROCESS_ERROR`.
        max_error_count: The budget of failed rows.
        description: Names the source in the warning and the error.

    Returns:
        ``(dataset without the failed rows, number of failed rows)``.
    """
    tagged = mapped.data.table.column(PREPROCESS_ERROR).is_valid().to_numpy(zero_copy_only=False)
    failed = np.flatnonzero(tagged)
    if not len(failed):
        return mapped, 0
    first = mapped.data.table.column(PREPROCESS_ERROR)[int(failed[0])].as_py()
    if len(failed) > max_error_count:
        raise PreprocessError(
            f"{description}: {len(failed)} rows failed preprocessing, more than "
            f"max_error_count={max_error_count}. First failure: {first}"
        )
    warnings.warn(
        f"{description}: skipped {len(failed)} rows whose preprocessing failed "
        f"(max_error_count={max_error_count}); the cache holds only the other rows. First "
        f"failure: {first}",
        stacklevel=3,
    )
    return mapped.select(np.flatnonzero(~tagged)), len(failed)
