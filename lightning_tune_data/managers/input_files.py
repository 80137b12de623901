"""A source's input files: resolving local paths, and naming what is wrong with a file (empty,
not UTF-8, malformed JSON lines, columns that differ between files) when loading fails."""

from __future__ import annotations

import glob
import json
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import datasets
import pyarrow as pa

from lightning_tune_data.managers.errors import DataSourceError
from lightning_tune_data.preprocess import PreprocessError

__all__ = ["InputFiles", "first_invalid_row", "resolve_local_files"]

#: ``datasets`` builders whose files are read line by line to name a problem.
LINE_BUILDERS = ("json", "csv", "text")


def first_invalid_row(chunk: pa.Array) -> int:
    """Position of the first element of ``chunk`` that fails full Arrow validation.

    Args:
        chunk: An Arrow array that fails full validation.
    """
    for position in range(len(chunk)):
        try:
            chunk.slice(position, 1).validate(full=True)
        except pa.ArrowInvalid:
            return position
    return 0


def resolve_local_files(entries: str | Sequence[str], field: str) -> tuple[list[str], list[str]]:
    """Expand globs and make paths absolute; return ``(files, missing entries)``.

    Args:
        entries: A path or glob, or a list of them.
        field: The option the entries come from (named in the error for a non-path entry).

    Raises:
        DataSourceError: An entry is not a path.
    """
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


class InputFiles:
    """The local data files of a source, and the diagnosis of problems in them.

    Args:
        paths: The local files the source reads.
        builder: The ``datasets`` builder that reads them (``"json"``, ``"csv"``, ...); the files
            of ``json``, ``csv`` and ``text`` are read line by line to name a problem.
        load_kwargs: The source's ``load_kwargs`` (a CSV ``delimiter``/``sep`` is taken from them).
    """

    def __init__(self, paths: list[str], builder: str | None, load_kwargs: Mapping[str, Any]) -> None:
        self.paths = paths
        self.builder = builder if builder in LINE_BUILDERS else None
        self.load_kwargs = load_kwargs

    def warn_empty(self, description: str) -> None:
        """Warn about each empty file (it adds no rows).

        Args:
            description: Names the source in the warning.
        """
        for path in self.paths:
            if os.path.getsize(path) == 0:
                warnings.warn(f"{description}: data file {path} is empty; it adds no rows.", stacklevel=2)

    def problems_note(self) -> str:
        """`` Problems found in the data files: ...`` for an error message, or ``""`` when none are found."""
        problems = self.problems()
        return f" Problems found in the data files: {'; '.join(problems)}." if problems else ""

    def problems(self, limit: int = 5) -> list[str]:
        """Name what is wrong with the files: empty, not UTF-8, malformed JSON lines, columns that
        differ between files. Only run when loading or checking failed (it reads every file once).

        Args:
            limit: At most this many problems are named.
        """
        builder = self.builder
        problems: list[str] = []
        columns: dict[str, list[str]] = {}
        for path in self.paths:
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

    def check_table(self, dataset: datasets.Dataset, description: str) -> None:
        """Fail, naming row, column and file, on raw data Arrow cannot read (e.g. invalid UTF-8).

        Args:
            dataset: The raw dataset, as loaded from the files.
            description: Names the source in the error.

        Raises:
            PreprocessError: A value fails Arrow's full validation.
        """
        table = dataset.data.table
        for name in table.column_names:
            offset = 0
            for chunk in table.column(name).chunks:
                try:
                    chunk.validate(full=True)
                except pa.ArrowInvalid as error:
                    row = offset + first_invalid_row(chunk)
                    found = self.problems_note()
                    raise PreprocessError(
                        f"{description}: row {row}, column '{name}' holds data that is "
                        f"not valid ({error}), e.g. text that is not UTF-8.{found} Fix the data "
                        f"(re-encode the file as UTF-8) and run prepare_data again."
                    ) from error
                offset += len(chunk)
