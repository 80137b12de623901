"""Subcommands of ``lightning-tune-data`` that are not Lightning runs (no Trainer, no model).

Each entry of :data:`COMMANDS` maps a subcommand name to the module that implements it; the module
has a ``main(argv: list[str]) -> int`` that parses its own arguments and returns the exit code,
and a docstring whose first line (``"``lightning-tune-data <name>``: <summary>"``) is the
subcommand's line in ``lightning-tune-data --help``. Adding an entry here is all it takes for the
subcommand to run and to be listed. ``fit``/``validate``/``test``/``predict`` go to the
LightningCLI instead.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re

#: subcommand name -> module path (the module defines ``main(argv) -> int``).
COMMANDS: dict[str, str] = {
    "cache": "lightning_tune_data.commands.cache",
    "prepare": "lightning_tune_data.commands.prepare",
    "report": "lightning_tune_data.commands.report",
}


def run_command(name: str, argv: list[str]) -> int:
    """Run subcommand ``name`` with its own arguments and return its exit code.

    Args:
        name: A key of :data:`COMMANDS`.
        argv: The subcommand's arguments (without the program and subcommand names).
    """
    module = importlib.import_module(COMMANDS[name])
    return int(module.main(argv) or 0)


def command_summary(name: str) -> str:
    """The one-line help of subcommand ``name``: the first line of its module's docstring.

    The ````lightning-tune-data <name> ...``:`` prefix is dropped and the first letter capitalised,
    so ``"``lightning-tune-data report``: a picture of the training data ..."`` reads
    ``"A picture of the training data ..."``. The module is read, not imported.

    Args:
        name: A key of :data:`COMMANDS`.
    """
    spec = importlib.util.find_spec(COMMANDS[name])
    if spec is None or spec.origin is None:
        return ""
    with open(spec.origin, encoding="utf-8") as handle:
        docstring = ast.get_docstring(ast.parse(handle.read())) or ""
    first = docstring.strip().splitlines()[0] if docstring.strip() else ""
    first = re.sub(r"^``[^`]*``\s*:\s*", "", first).strip()
    return first[:1].upper() + first[1:]


def command_summaries() -> dict[str, str]:
    """Every subcommand of :data:`COMMANDS` with its one-line help, in the order they are registered."""
    return {name: command_summary(name) for name in COMMANDS}
