"""The options every dataset manager shares, checked once and kept in one frozen object.

``DatasetManager`` and ``LocalDatasetManager`` take the same keyword arguments for how a source is
preprocessed, mixed and streamed (weight, preprocess function, stages, transforms, retries, ...).
Each constructor lists them (LightningCLI and YAML configs read the signatures) and hands them to
:meth:`SourceOptions.from_arguments`, which checks them, fails early naming the source, and
returns the :class:`SourceOptions` the manager keeps.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lightning_tune_data.cache.fingerprints import callable_identity
from lightning_tune_data.managers.errors import DataSourceError
from lightning_tune_data.mixing.mix_schedule import parse_count
from lightning_tune_data.preprocess import resolve_callable

__all__ = [
    "DEFAULT_PREPROCESS",
    "STAGES",
    "STREAM_RETRY_DEFAULTS",
    "TRANSFORM_ARGUMENTS",
    "SourceOptions",
    "validate_stages",
    "validate_stream_retries",
]

#: Trainer stages a manager can take part in.
STAGES = ("fit", "validate", "test", "predict")
#: The preprocess function of a manager that names none.
DEFAULT_PREPROCESS = "lightning_tune_data.preprocess.tokenize_text"
#: Defaults of ``stream_retries`` (network retries of a streaming source).
STREAM_RETRY_DEFAULTS = {"max_retries": 3, "retry_backoff_s": 1.0, "retry_timeout_s": 300.0, "read_timeout_s": 60.0}
#: Constructor arguments that make up ``SourceOptions.transforms``, in the order they apply.
TRANSFORM_ARGUMENTS = ("message_transform", "model_transform", "output_transform", "filter_fn", "filter_kwargs")
#: The per-sample callables among them (``filter_kwargs`` holds the filter's keyword arguments).
TRANSFORM_CALLABLES = ("message_transform", "model_transform", "output_transform", "filter_fn")
#: ``datasets.load_dataset`` arguments the manager sets itself (so not allowed in ``load_kwargs``).
MANAGER_LOAD_ARGUMENTS = ("path", "name", "split", "streaming", "data_files")


def validate_stages(stages: Sequence[str] | None, owner: str) -> list[str]:
    """``stages`` as a list without repeats (``None``: all of :data:`STAGES`).

    Args:
        stages: A stage, a list of stages, or ``None``.
        owner: Names the manager in the error message.

    Raises:
        DataSourceError: A stage is not one of :data:`STAGES`, or the list is empty.
    """
    if stages is None:
        return list(STAGES)
    if isinstance(stages, str):
        stages = [stages]
    bad = [s for s in stages if s not in STAGES]
    if bad or not stages:
        raise DataSourceError(
            f"{owner}: stages {list(stages)!r} invalid: {bad or 'empty list'}; each stage must be "
            f"one of {list(STAGES)} (or leave stages unset for all of them)."
        )
    return list(dict.fromkeys(stages))


def validate_stream_retries(value: Mapping[str, Any] | None, description: str) -> dict[str, float]:
    """``stream_retries`` merged over :data:`STREAM_RETRY_DEFAULTS` (``max_retries`` as an int).

    Args:
        value: The user's retry options, or ``None`` for the defaults.
        description: Names the source in error messages.

    Raises:
        DataSourceError: An unknown key, or a value that is not a number >= 0.
    """
    if value is None:
        return dict(STREAM_RETRY_DEFAULTS)
    unknown = sorted(set(value) - set(STREAM_RETRY_DEFAULTS)) if isinstance(value, Mapping) else None
    if unknown is None or unknown:
        raise DataSourceError(
            f"{description}: stream_retries must be a mapping with keys among {sorted(STREAM_RETRY_DEFAULTS)}, got "
            f"{value!r}."
        )
    merged = {**STREAM_RETRY_DEFAULTS, **value}
    for key, number in merged.items():
        if isinstance(number, bool) or not isinstance(number, (int, float)) or number < 0:
            raise DataSourceError(f"{description}: stream_retries.{key} must be a number >= 0, got {number!r}.")
    merged["max_retries"] = int(merged["max_retries"])
    return merged


def _check_numbers(arguments: Mapping[str, Any], description: str) -> None:
    weight, num_proc, max_error_count = arguments["weight"], arguments["num_proc"], arguments["max_error_count"]
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not np.isfinite(weight) or weight < 0:
        raise DataSourceError(f"{description}: weight must be a finite number >= 0, got {weight!r}.")
    if num_proc is not None and (not isinstance(num_proc, int) or num_proc < 1):
        raise DataSourceError(f"{description}: num_proc must be None or >= 1, got {num_proc!r}.")
    if not isinstance(max_error_count, int) or max_error_count < 0:
        raise DataSourceError(
            f"{description}: max_error_count must be an integer >= 0, got {max_error_count!r}."
        )
    for name in ("preprocess_kwargs", "load_kwargs"):
        if arguments[name] is not None and not isinstance(arguments[name], Mapping):
            raise DataSourceError(f"{description}: {name} must be a mapping, got {arguments[name]!r}.")


def source_caps(max_epochs: Any, max_tokens: Any, description: str) -> dict[str, float | None]:
    """A train source's caps, checked: ``max_epochs`` a number > 0, ``max_tokens`` a count > 0
    (``"40B"``, ``"30M"`` or a number).

    Args:
        max_epochs: most passes over the source (``None``: no cap).
        max_tokens: most tokens taken from the source (``None``: no cap).
        description: names the source in error messages.
    """
    if max_epochs is not None and (isinstance(max_epochs, bool) or not isinstance(max_epochs, (int, float))
                                   or not np.isfinite(max_epochs) or max_epochs <= 0):
        raise DataSourceError(f"{description}: max_epochs must be a number > 0 (passes over the source), "
                              f"got {max_epochs!r}.")
    tokens = None
    if max_tokens is not None:
        try:
            tokens = parse_count(max_tokens, f"{description}: max_tokens")
        except ValueError as error:
            raise DataSourceError(str(error)) from None
        if tokens <= 0:
            raise DataSourceError(f"{description}: max_tokens must be > 0, got {max_tokens!r}.")
    return {"max_epochs": None if max_epochs is None else float(max_epochs), "max_tokens": tokens}


def _check_load_kwargs(load_kwargs: Mapping[str, Any], description: str) -> None:
    clashes = sorted(key for key in load_kwargs if key in MANAGER_LOAD_ARGUMENTS)
    if clashes:
        raise DataSourceError(
            f"{description}: load_kwargs {clashes} repeat arguments the manager passes to "
            f"datasets.load_dataset itself. Set them as the manager's own options "
            f"({', '.join(clashes)}) and remove them from load_kwargs."
        )


@dataclass(frozen=True)
class SourceOptions:
    """How a source is preprocessed, mixed and streamed (everything but where its data is).

    Build it with :meth:`from_arguments`, which checks the values; the defaults here are those of
    a source that is read as it is (``UnconditionalGenerationDatasetManager`` uses them).

    Args:
        weight: Relative sampling weight among the train sources (>= 0).
        preprocess_function: Dotted path or callable; ``None`` for pre-tokenized data.
        preprocess_kwargs: Extra keyword arguments of the preprocess function.
        columns_to_remove: Columns the preprocessing map drops (``None``: all original columns).
        stages: Trainer stages the source is used in.
        streaming: Stream and tokenize lazily instead of building a cache.
        num_proc: Processes for download preparation and tokenization.
        load_kwargs: Extra keyword arguments of ``datasets.load_dataset``.
        shuffle: Whether the training stream shuffles the source.
        max_error_count: Failing rows or samples that may be skipped (and counted).
        transforms: The per-sample transforms and filter that were given, by argument name.
        stream_retries: Network retry bounds of a streaming source (see :data:`STREAM_RETRY_DEFAULTS`).
        cache_dir: Where this source's store lives when not under the datamodule's ``cache_dir``
            (a local path or an fsspec URL).
        max_epochs: Most passes over the source a train run takes (fractional allowed; ``None``: no cap).
        max_tokens: Most tokens a train run takes from the source (``None``: no cap).
    """

    weight: float = 1.0
    preprocess_function: str | Callable | None = None
    preprocess_kwargs: dict[str, Any] = field(default_factory=dict)
    columns_to_remove: list[str] | None = None
    stages: list[str] = field(default_factory=lambda: list(STAGES))
    streaming: bool = False
    num_proc: int | None = None
    load_kwargs: dict[str, Any] = field(default_factory=dict)
    shuffle: bool = True
    max_error_count: int = 0
    transforms: dict[str, Any] = field(default_factory=dict)
    stream_retries: dict[str, float] = field(default_factory=lambda: dict(STREAM_RETRY_DEFAULTS))
    cache_dir: str | None = None
    max_epochs: float | None = None
    max_tokens: float | None = None

    @classmethod
    def from_arguments(cls, description: str, arguments: Mapping[str, Any]) -> SourceOptions:
        """Check a manager's constructor arguments and keep them as options.

        Args:
            description: Names the source in error messages.
            arguments: The constructor's arguments by name (its ``locals()``): every field of this
                class except ``transforms``, plus the arguments in :data:`TRANSFORM_ARGUMENTS`.

        Raises:
            DataSourceError: A value is out of range, ``load_kwargs`` repeats an argument the
                manager sets, the preprocess function does not import, or ``preprocess_kwargs``
                are not parameters of it (or are given without one).
            ValueError: A transform's or filter's dotted path does not import.
        """
        _check_numbers(arguments, description)
        stream_retries = validate_stream_retries(arguments["stream_retries"], description)
        stages = validate_stages(arguments["stages"], description)
        load_kwargs = dict(arguments["load_kwargs"] or {})
        _check_load_kwargs(load_kwargs, description)
        transforms = {name: arguments[name] for name in TRANSFORM_ARGUMENTS if arguments[name] is not None}
        for name in TRANSFORM_CALLABLES:
            if name in transforms:
                resolve_callable(transforms[name], f"{description}: {name}")  # fail early on a bad path
        columns_to_remove = arguments["columns_to_remove"]
        options = cls(
            weight=float(arguments["weight"]),
            # The spec is kept (a string pickles by value; the function is re-imported where needed).
            preprocess_function=arguments["preprocess_function"],
            preprocess_kwargs=dict(arguments["preprocess_kwargs"] or {}),
            columns_to_remove=list(columns_to_remove) if columns_to_remove is not None else None,
            stages=stages,
            streaming=bool(arguments["streaming"]),
            num_proc=arguments["num_proc"],
            load_kwargs=load_kwargs,
            shuffle=bool(arguments["shuffle"]),
            max_error_count=arguments["max_error_count"],
            transforms=transforms,
            stream_retries=stream_retries,
            cache_dir=None if arguments.get("cache_dir") is None else str(arguments["cache_dir"]),
            **source_caps(arguments.get("max_epochs"), arguments.get("max_tokens"), description),
        )
        if options.preprocess_function is not None:
            options.check_preprocess_kwargs(options.resolve_preprocess_function(description), description)
        elif options.preprocess_kwargs:
            raise DataSourceError(
                f"{description}: preprocess_kwargs {options.preprocess_kwargs} given but "
                f"preprocess_function is None."
            )
        return options

    def resolve_preprocess_function(self, description: str) -> Callable | None:
        """The preprocess function itself (``None`` when the data is pre-tokenized).

        Args:
            description: Names the source in the error.

        Raises:
            DataSourceError: The dotted path does not import; the message names ``description``.
        """
        if self.preprocess_function is None:
            return None
        try:
            return resolve_callable(self.preprocess_function, "preprocess_function")
        except ValueError as error:
            raise DataSourceError(f"{description}: {error}") from error

    def preprocess_label(self) -> str:
        """``'module.function'`` of the preprocess function, for messages."""
        spec = self.preprocess_function
        if isinstance(spec, str):
            return f"'{spec}'"
        return f"'{getattr(spec, '__module__', '?')}.{getattr(spec, '__qualname__', repr(spec))}'"

    def check_preprocess_kwargs(self, function: Callable, description: str) -> None:
        """Fail when ``preprocess_kwargs`` holds a name the preprocess function does not accept.

        Args:
            function: The resolved preprocess function.
            description: Names the source in the error.

        Raises:
            DataSourceError: Naming the unknown keyword arguments and the accepted ones.
        """
        try:
            params = inspect.signature(function).parameters
        except (TypeError, ValueError):
            return
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            return
        positional = list(params)[:2]  # (examples, tokenizer)
        accepted = [n for n in params if n not in positional]
        unknown = [k for k in self.preprocess_kwargs if k not in accepted]
        if unknown:
            raise DataSourceError(
                f"{description}: preprocess_kwargs {unknown} are not parameters of "
                f"preprocess_function {self.preprocess_label()}; it accepts {accepted}."
            )

    def preprocess_identity(self, function: Callable | None) -> dict[str, Any]:
        """The fingerprint part of the preprocessing: what changes the cached tokens.

        Args:
            function: The resolved preprocess function (``None``: pre-tokenized data).
        """
        return {
            "function": callable_identity(function) if function is not None else None,
            "kwargs": self.preprocess_kwargs,
            "columns_to_remove": self.columns_to_remove,
            "max_error_count": self.max_error_count,
        }

    def stream_transforms(self, description: str) -> dict[str, Any]:
        """The transforms and filter as callables (``filter_kwargs`` as a dict), in their order.

        Args:
            description: Names the source in the error.

        Raises:
            ValueError: A dotted path does not import; the message names ``description``.
        """
        resolved = {
            name: resolve_callable(spec, f"{description}: {name}")
            for name, spec in self.transforms.items()
            if name != "filter_kwargs"
        }
        if "filter_kwargs" in self.transforms:
            resolved["filter_kwargs"] = dict(self.transforms["filter_kwargs"])
        return resolved

    def stream_options(self) -> dict[str, float]:
        """Retry bounds a streaming source reads with (``HFStreamingSource`` keyword arguments)."""
        return {k: v for k, v in self.stream_retries.items() if k != "read_timeout_s"}

    def stream_storage_options(self) -> dict[str, Any]:
        """``load_dataset`` storage options: a remote read waiting longer than ``read_timeout_s``
        fails (and is retried by the source) instead of hanging."""
        import aiohttp

        seconds = self.stream_retries["read_timeout_s"]
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=seconds, sock_read=seconds)
        return {protocol: {"client_kwargs": {"timeout": timeout}} for protocol in ("http", "https")}
