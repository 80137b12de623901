"""``lightning-tune-data`` / ``python -m lightning_tune_data``: LightningCLI over ``TextDataModule``.

Subcommands ``fit``, ``validate``, ``test`` and ``predict``; the model is any LightningModule
given by ``class_path`` (e.g. ``lightning_tune_data.models.TinyCausalLM``). The datamodule's
``vocab_size`` and ``max_seq_len`` are linked into the model when both are instantiated.

Dotted paths in configs (``preprocess_function: mymodule.fn``) are imported with the current
directory on the import path, so a module next to where the command runs is found. A manager that
cannot be built (missing file, bad option, failing import) stops the run with one message that
starts with the config path of the source, e.g. ``data.dataset_managers.train.notes: ...``.

Every config or data error is one line on stderr (:mod:`lightning_tune_data.cli.error_lines`): a
misspelt key gets the closest accepted spelling, a data error (missing column, unreachable dataset)
is addressed by its source's config path. ``LIGHTNING_TUNE_DATA_VERBOSE=1`` shows the full parser
message or traceback instead. Ctrl-C stops a run with Lightning's graceful shutdown, whenever it
arrives (:mod:`lightning_tune_data.cli.interrupts`). ``--help`` lists the data subcommands of
:data:`lightning_tune_data.commands.COMMANDS` next to the Lightning ones.
"""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys
import warnings
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import ArgumentParser, Namespace, get_loader, set_loader
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

from lightning_tune_data.cli.error_lines import (
    PROGRAM,
    VERBOSE_VARIABLE,
    ConfigError,
    config_files,
    describe_parse_error,
    describe_run_error,
    error_line,
    verbose,
)
from lightning_tune_data.cache.mirror import StoreCorruptError
from lightning_tune_data.cache.root import CacheBudgetError, StorageError
from lightning_tune_data.cache.store import CacheReadOnlyError
from lightning_tune_data.cache.tasks import StoreNotCommittedError
from lightning_tune_data.cli.interrupts import InterruptCallback, install_interrupt_handling
from lightning_tune_data.commands import COMMANDS, command_summaries, run_command
from lightning_tune_data.datamodule.module import TextDataModule
from lightning_tune_data.loading.known_warnings import KNOWN_THIRD_PARTY_WARNINGS
from lightning_tune_data.managers.errors import CacheMissingError, DataSourceError
from lightning_tune_data.preprocess import PreprocessError

__all__ = ["ConfigError", "TuneArgumentParser", "TuneDataCLI", "check_dataset_managers", "main", "run_cli"]

#: Errors of the user's data or config raised while a run prepares or reads its sources: printed as
#: one line addressed by the source's config path (the traceback only with the verbose variable).
DATA_ERRORS = (ConfigError, DataSourceError, PreprocessError, CacheMissingError, StorageError, CacheBudgetError,
               CacheReadOnlyError, StoreNotCommittedError, StoreCorruptError)
DESCRIPTION = (
    "Train, evaluate and predict with LightningCLI over a mixture of text datasets "
    "(fit/validate/test/predict), and inspect the data (the other subcommands). Errors in a config "
    f"or in the data are one line; set {VERBOSE_VARIABLE}=1 for the full message and traceback."
)


def _silence_known_noise() -> None:
    """Filter the known third-party warnings and Lightning's advertising tips (not the user's)."""
    for pattern in KNOWN_THIRD_PARTY_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)

    class _NoTips(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return "💡 Tip:" not in record.getMessage()

    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _NoTips) for f in logger.filters):
        logger.addFilter(_NoTips())


def make_cwd_importable() -> None:
    """Put the working directory on ``sys.path`` (``python -m`` does; a console script does not)."""
    cwd = os.getcwd()
    if "" not in sys.path and cwd not in sys.path:
        sys.path.insert(0, cwd)


def _plain(value: Any) -> Any:
    if isinstance(value, Namespace):
        return {key: _plain(item) for key, item in vars(value).items()}
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _import_class(class_path: str) -> type:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def check_dataset_managers(data_config: Any) -> None:
    """Build every configured manager once, so a failure names its config path in the first line.

    Args:
        data_config: the parsed ``data`` section of the config (``None``: nothing to check).

    Raises:
        ConfigError: ``data.dataset_managers.<split>.<name> (<class>): <the manager's message>``.
    """
    managers = _plain(data_config.get("dataset_managers") if data_config is not None else None)
    if not isinstance(managers, dict):
        return
    for split, entries in managers.items():
        named = entries.items() if isinstance(entries, dict) else enumerate(entries or [])
        for name, spec in named:
            if not isinstance(spec, dict) or "class_path" not in spec:
                continue
            where = f"data.dataset_managers.{split}.{name}"
            try:
                cls = _import_class(spec["class_path"])
            except (ImportError, AttributeError, ValueError) as error:
                raise ConfigError(f"{where}.class_path: cannot import {spec['class_path']!r} ({error}). "
                                  "Use e.g. lightning_tune_data.LocalDatasetManager.") from error
            try:
                cls(**(spec.get("init_args") or {}))
            except Exception as error:  # noqa: BLE001 - any failure: reported with the config path
                raise ConfigError(f"{where} ({cls.__name__}): {error}") from error


class TuneArgumentParser(LightningArgumentParser):
    """The CLI's parser: a config error ends the run with one line instead of the usage dump.

    ``config_files`` (set by :class:`TuneDataCLI` before parsing) holds the ``--config`` files, so
    the message can name the manager and the file that set the wrong key. With
    ``LIGHTNING_TUNE_DATA_VERBOSE=1`` (or jsonargparse's ``JSONARGPARSE_DEBUG``) errors are
    reported by jsonargparse itself, usage included.
    """

    command_line: list[str] = []
    config_files: dict[str, Path] = {}

    def error(self, message: str, ex: Exception | None = None) -> None:
        """Print ``lightning-tune-data: error: <config path>: <problem>. <fix>`` and exit with code 2.

        Args:
            message: jsonargparse's message.
            ex: The exception behind it, if any.
        """
        if not self.exit_on_error or verbose() or os.environ.get("JSONARGPARSE_DEBUG"):
            super().error(message, ex)
        parser = getattr(ex, "subcommand_parser", None) or self._subcommand_parser() or self
        root = self._root()
        dests = [action.dest for action in parser._actions]
        subcommands = [*root._subcommand_names(), *COMMANDS]
        sys.stderr.write(error_line(describe_parse_error(message, dests, root.config_files, subcommands)) + "\n")
        self.exit(2)

    def _root(self) -> TuneArgumentParser:
        """The top parser (a subcommand's parser reports errors too; the top one knows the command line)."""
        parser = self
        while isinstance(getattr(parser, "parent_parser", None), TuneArgumentParser):
            parser = parser.parent_parser
        return parser

    def _subcommand_names(self) -> list[str]:
        action = self._subcommands_action
        return [name for name in (action.choices if action is not None else {}) if name not in COMMANDS]

    def _subcommand_parser(self) -> ArgumentParser | None:
        root = self._root()
        action = root._subcommands_action
        for token in root.command_line:
            if action is not None and token in action.choices:
                return action.choices[token]
        return None


class TuneDataCLI(LightningCLI):
    """LightningCLI with the data -> model links this package needs.

    It also builds every configured manager before the rest (so a bad one is reported by its
    config path), shows ``ByteTokenizer`` as the tokenizer's default, lists the data subcommands
    (:data:`~lightning_tune_data.commands.COMMANDS`) in ``--help``, reports a data error raised
    during the run by its source's config path, adds
    :class:`~lightning_tune_data.cli.interrupts.InterruptCallback`, and, unless the config
    disables the progress bar or brings its own, uses :class:`~lightning_tune_data.cli.progress.StepProgressBar`.
    """

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        """Parse ``args`` (``None``: ``sys.argv[1:]``), telling the parser the command line for its errors.

        Args:
            parser: the CLI's argument parser.
            args: the command line without the program name, or a config dict.
        """
        if isinstance(parser, TuneArgumentParser):
            parser.command_line = list(sys.argv[1:] if args is None else args if isinstance(args, list) else [])
            parser.config_files = config_files(parser.command_line)
        super().parse_arguments(parser, args)

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        """The Lightning subcommands, then one help entry per data subcommand of ``COMMANDS``."""
        super()._add_subcommands(parser, **kwargs)
        action = parser._subcommands_action
        for name, summary in command_summaries().items():
            listing = ArgumentParser(description=f"{summary} Run `{PROGRAM} {name} --help` for its options.")
            action.add_subcommand(name, listing, help=summary)

    def _run_subcommand(self, subcommand: str) -> None:
        """Run the subcommand; a data error is re-addressed by its source's config path."""
        try:
            super()._run_subcommand(subcommand)
        except DATA_ERRORS as error:
            if isinstance(error, ConfigError):
                raise
            config = self.config.get(subcommand, self.config)
            managers = _plain((config.get("data") or {}).get("dataset_managers"))
            raise ConfigError(describe_run_error(error, managers)) from error

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Link the datamodule's ``vocab_size`` and ``max_seq_len`` into the model; default tokenizer.

        Args:
            parser: the CLI's argument parser.
        """
        parser.link_arguments("data.vocab_size", "model.init_args.vocab_size", apply_on="instantiate")
        parser.link_arguments("data.max_seq_len", "model.init_args.max_seq_len", apply_on="instantiate")
        parser.set_defaults({"data.tokenizer": {"class_path": "lightning_tune_data.ByteTokenizer"}})

    def before_instantiate_classes(self) -> None:
        """Build every configured manager once, so a bad one is reported by its config path."""
        config = self.config.get(str(self.subcommand), self.config) if self.subcommand else self.config
        check_dataset_managers(config.get("data"))

    def instantiate_classes(self) -> None:
        """Build the classes; a datamodule config error is reported with its ``data.`` path."""
        try:
            super().instantiate_classes()
        except ValueError as error:
            text = str(error)
            if text.startswith("TextDataModule."):  # the datamodule's own checks name the field
                raise ConfigError("data." + text.removeprefix("TextDataModule.")) from error
            raise

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        callbacks = [*callbacks, InterruptCallback()]
        configured = list(config.get("callbacks") or []) + list(callbacks)
        if (_RICH_AVAILABLE and config.get("enable_progress_bar") is not False
                and not any(isinstance(c, ProgressBar) for c in configured)):
            from lightning_tune_data.cli.progress import StepProgressBar

            callbacks = [*callbacks, StepProgressBar()]
        return super()._instantiate_trainer(config, callbacks)


class _DuplicateKeyChecker(yaml.SafeLoader):
    """A YAML loader that refuses duplicate mapping keys (PyYAML silently keeps the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None,
                    f"duplicate key {key!r} (first at line {seen[key] + 1}); names such as dataloader names "
                    "must be unique: rename one of them",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _strict_yaml_loader(default_loader):  # noqa: ANN001, ANN202 - jsonargparse's loader callable
    def load(text: str):  # noqa: ANN202
        yaml.load(text, Loader=_DuplicateKeyChecker)  # raises on duplicates; parsing itself stays jsonargparse's
        return default_loader(text)

    return load


set_loader("yaml", _strict_yaml_loader(get_loader("yaml")), exceptions=(yaml.YAMLError,))


def run_cli(args: list[str] | None = None) -> TuneDataCLI:
    """Build and run the CLI; returns it for inspection.

    Args:
        args: the command line without the program name (``None``: ``sys.argv[1:]``).
    """
    return TuneDataCLI(
        model_class=LightningModule,
        datamodule_class=TextDataModule,
        subclass_mode_model=True,
        save_config_kwargs={"overwrite": True},
        parser_class=TuneArgumentParser,
        parser_kwargs={"prog": PROGRAM, "description": DESCRIPTION},
        args=args,
    )


def main(args: list[str] | None = None) -> None:
    """Entry point of the console script and ``python -m lightning_tune_data``.

    Subcommands listed in :data:`lightning_tune_data.commands.COMMANDS` (data tools that need
    no Trainer) run on their own; everything else goes to the LightningCLI. A config or data error
    is printed as one line (exit code 2), an interrupt outside the Trainer as ``interrupted``
    (exit code 130); with ``LIGHTNING_TUNE_DATA_VERBOSE=1`` both raise with their traceback.

    Args:
        args: the command line without the program name (``None``: ``sys.argv[1:]``).
    """
    argv = sys.argv[1:] if args is None else list(args)
    if argv and argv[0] in COMMANDS:
        raise SystemExit(run_command(argv[0], argv[1:]))
    make_cwd_importable()
    _silence_known_noise()
    previous_handler = signal.getsignal(signal.SIGINT)
    install_interrupt_handling()
    try:
        run_cli(args)
    except DATA_ERRORS as error:
        if verbose():
            raise
        sys.stderr.write(error_line(error) + "\n")
        raise SystemExit(2) from None
    except KeyboardInterrupt:
        if verbose():
            raise
        sys.stderr.write(f"{PROGRAM}: interrupted\n")
        raise SystemExit(130) from None
    finally:
        if previous_handler is not None:  # None: a handler not set from Python, left as it was
            signal.signal(signal.SIGINT, previous_handler)


if __name__ == "__main__":
    main()
