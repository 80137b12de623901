"""``lightning-tune-data`` / ``python -m lightning_tune_data``: LightningCLI over ``TextDataModule``.

Subcommands ``fit``, ``validate``, ``test`` and ``predict``; the model is any LightningModule
given by ``class_path`` (e.g. ``lightning_tune_data.models.TinyCausalLM``). The datamodule's
``vocab_size`` and ``max_seq_len`` are linked into the model when both are instantiated.

Dotted paths in configs (``preprocess_function: mymodule.fn``) are imported with the current
directory on the import path, so a module next to where the command runs is found. A manager that
cannot be built (missing file, bad option, failing import) stops the run with one message that
starts with the config path of the source, e.g. ``data.dataset_managers.train.notes: ...``.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
import warnings
from typing import Any

import yaml
from jsonargparse import Namespace, get_loader, set_loader
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback, ProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities.imports import _RICH_AVAILABLE

from lightning_tune_data.commands import COMMANDS, run_command
from lightning_tune_data.datamodule.module import TextDataModule
from lightning_tune_data.loading.known_warnings import KNOWN_THIRD_PARTY_WARNINGS



class ConfigError(ValueError):
    """A config value cannot be turned into a working object; the message starts with its path."""


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


class TuneDataCLI(LightningCLI):
    """LightningCLI with the data -> model links this package needs.

    It also builds every configured manager before the rest (so a bad one is reported by its
    config path), shows ``ByteTokenizer`` as the tokenizer's default, and, unless the config
    disables the progress bar or brings its own, uses :class:`~lightning_tune_data.cli.progress.StepProgressBar`.
    """

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
        args=args,
    )


def main(args: list[str] | None = None) -> None:
    """Entry point of the console script and ``python -m lightning_tune_data``.

    Subcommands listed in :data:`lightning_tune_data.commands.COMMANDS` (data tools that need
    no Trainer) run on their own; everything else goes to the LightningCLI.

    Args:
        args: the command line without the program name (``None``: ``sys.argv[1:]``).
    """
    argv = sys.argv[1:] if args is None else list(args)
    if argv and argv[0] in COMMANDS:
        raise SystemExit(run_command(argv[0], argv[1:]))
    make_cwd_importable()
    _silence_known_noise()
    try:
        run_cli(args)
    except ConfigError as error:
        sys.stderr.write(f"lightning-tune-data: error: {error}\n")
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
