"""Subcommands of ``lightning-tune-data`` that are not Lightning runs (no Trainer, no model).

Each entry maps a subcommand name to the module that implements it; the module has a
``main(argv: list[str]) -> int`` that parses its own arguments and returns the exit code.
``fit``/``validate``/``test``/``predict`` go to the LightningCLI instead.
"""

from __future__ import annotations

import importlib

#: subcommand name -> module path (the module defines ``main(argv) -> int``).
COMMANDS: dict[str, str] = {
    "cache": "lightning_tune_data.commands.cache",
    "prepare": "lightning_tune_data.commands.prepare",
    "report": "lightning_tune_data.commands.report",
}


def run_command(name: str, argv: list[str]) -> int:
    """Run subcommand ``name`` with its own arguments and return its exit code."""
    module = importlib.import_module(COMMANDS[name])
    return int(module.main(argv) or 0)
