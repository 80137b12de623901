"""``lightning-tune-data`` / ``python -m lightning_tune_data``: LightningCLI over ``TextDataModule``.

Subcommands ``fit``, ``validate``, ``test`` and ``predict``; the model is any LightningModule
given by ``class_path`` (e.g. ``lightning_tune_data.models.TinyCausalLM``). The datamodule's
``vocab_size`` and ``max_seq_len`` are linked into the model when both are instantiated.
"""

from __future__ import annotations

import sys

import yaml
from jsonargparse import get_loader, set_loader
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from .commands import COMMANDS, run_command
from .datamodule import TextDataModule


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


class TuneDataCLI(LightningCLI):
    """LightningCLI with the data -> model links this package needs."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.link_arguments("data.vocab_size", "model.init_args.vocab_size", apply_on="instantiate")
        parser.link_arguments("data.max_seq_len", "model.init_args.max_seq_len", apply_on="instantiate")


def run_cli(args: list[str] | None = None) -> TuneDataCLI:
    """Build and run the CLI (``args`` defaults to ``sys.argv[1:]``); returns it for inspection."""
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
    """
    argv = sys.argv[1:] if args is None else list(args)
    if argv and argv[0] in COMMANDS:
        raise SystemExit(run_command(argv[0], argv[1:]))
    run_cli(args)


if __name__ == "__main__":
    main()
