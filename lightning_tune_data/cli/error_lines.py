"""One-line errors: what ``lightning-tune-data`` prints when a config or the data is wrong.

Every config or data problem ends the run with one line on stderr::

    lightning-tune-data: error: <config path> (<class>): <what is wrong>. <the fix> (in <config file>)

e.g. ``data.dataset_managers.train.a (LocalDatasetManager): option 'data_file' is not accepted. Did
you mean 'data_files'?``. Misspelt keys, class names and choices get the closest accepted spelling.
Set ``LIGHTNING_TUNE_DATA_VERBOSE=1`` to get the full parser message (with the usage) or the full
traceback instead.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "PROGRAM",
    "VERBOSE_VARIABLE",
    "ConfigError",
    "config_files",
    "describe_parse_error",
    "describe_run_error",
    "did_you_mean",
    "error_line",
    "verbose",
]

#: The program name every one-line error starts with.
PROGRAM = "lightning-tune-data"
#: Environment variable that turns the one-line errors back into full messages and tracebacks.
VERBOSE_VARIABLE = "LIGHTNING_TUNE_DATA_VERBOSE"
MANAGERS = "data.dataset_managers"


class ConfigError(ValueError):
    """A config value cannot be turned into a working object; the message starts with its path."""


def verbose() -> bool:
    """Whether ``LIGHTNING_TUNE_DATA_VERBOSE`` asks for full messages and tracebacks."""
    return os.environ.get(VERBOSE_VARIABLE, "").strip().lower() not in ("", "0", "false", "no", "off")


def error_line(message: str) -> str:
    """``lightning-tune-data: error: <message>`` on one line (newlines and runs of spaces collapsed).

    Args:
        message: What is wrong and how to fix it.
    """
    return f"{PROGRAM}: error: {' '.join(str(message).split())}"


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """`` Did you mean 'x'?`` for the accepted spelling closest to ``name`` ("" when none is close).

    Args:
        name: The misspelt key, class name or value.
        choices: The accepted spellings.
    """
    close = difflib.get_close_matches(name, sorted(set(choices)), n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


def config_files(command_line: Sequence[str]) -> dict[str, Path]:
    """The YAML files given with ``--config``/``-c`` on ``command_line`` that exist, in order.

    Call it before parsing: the parser changes the working directory while it reads a config.

    Args:
        command_line: The arguments of the command (without the program name).

    Returns:
        Each file as the command line names it -> its absolute path.
    """
    files = {}
    for index, token in enumerate(command_line):
        value = None
        if token in ("--config", "-c") and index + 1 < len(command_line):
            value = command_line[index + 1]
        elif token.startswith("--config="):
            value = token.split("=", 1)[1]
        if value and Path(value).is_file():
            files[value] = Path(value).resolve()
    return files


def _load(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None


def _lookup(config: Any, dotted: str) -> bool:
    for part in dotted.split("."):
        if not isinstance(config, dict) or part not in config:
            return False
        config = config[part]
    return True


def _file_with(files: Mapping[str, Path], dotted: str) -> str:
    """`` (in <file>)`` for the last config file that sets ``dotted`` ("" when none does)."""
    for shown, path in reversed(files.items()):
        if _lookup(_load(path), dotted):
            return f" (in {shown})"
    return ""


def _manager_specs(config: Any) -> Iterable[tuple[str, dict]]:
    """``(config path, spec)`` of every manager in a loaded config."""
    managers = ((config or {}).get("data") or {}).get("dataset_managers") if isinstance(config, dict) else None
    for split, entries in (managers or {}).items() if isinstance(managers, dict) else ():
        named = entries.items() if isinstance(entries, dict) else enumerate(entries or [])
        for name, spec in named:
            if isinstance(spec, dict):
                yield f"{MANAGERS}.{split}.{name}", spec


def _find_manager(files: Mapping[str, Path], class_path: str, option: str | None) -> tuple[str, str]:
    """The config path of the manager with ``class_path`` (and ``option``), and the file setting it."""
    for shown, path in reversed(files.items()):
        for where, spec in _manager_specs(_load(path)):
            init_args = spec.get("init_args") if isinstance(spec.get("init_args"), dict) else {}
            if spec.get("class_path") == class_path and (option is None or option in init_args):
                return where, f" (in {shown})"
    return MANAGERS, ""


def _accepted_arguments(class_path: str) -> list[str]:
    """The keyword arguments ``class_path``'s constructor (and its parents' when it takes ``**kwargs``) accepts."""
    try:
        cls = _import(class_path)
    except (ImportError, AttributeError, ValueError):
        return []
    names: list[str] = []
    for klass in inspect.getmro(cls):
        if "__init__" not in vars(klass):
            continue
        parameters = inspect.signature(klass.__init__).parameters.values()
        names += [p.name for p in parameters if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    return names


def _import(class_path: str) -> type:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _children(dests: Iterable[str], prefix: str) -> set[str]:
    start = f"{prefix}." if prefix else ""
    return {dest[len(start):].split(".")[0] for dest in dests if dest.startswith(start) and len(dest) > len(start)}


def _unknown_key(key: str, dests: Sequence[str], files: Mapping[str, Path]) -> str:
    """``<parent>: unknown option '<leaf>'. Did you mean ...`` for a dotted key no parser option matches."""
    parts = key.split(".")
    for depth in range(len(parts)):
        parent = ".".join(parts[:depth])
        accepted = _children(dests, parent)
        if parts[depth] not in accepted:
            where = ".".join(parts[:depth + 1])
            within = f" in {parent}" if parent else ""
            return (f"{where}: no such option{within}.{did_you_mean(parts[depth], accepted)}"
                    f"{_file_with(files, key)}")
    return f"{key}: not accepted here{_file_with(files, key)}"


_NOT_ACCEPTED = re.compile(r"does not accept option '([^']+)'")
_UNRECOGNIZED = re.compile(r"unrecognized arguments: --([\w.]+)")
_PARSER_KEY = re.compile(r'Parser key "([^"]+)"')
_CLASS_PATH = re.compile(r"Problem with given class_path '([^']+)':\s*\n\s*(.+)")
_OPTION = re.compile(r"Option '([^']+)' is not accepted")
_NO_ATTRIBUTE = re.compile(r"has no attribute '([^']+)'|No module named '([^']+)'")
_LITERAL = re.compile(r"Expected a typing\.Literal\[([^\]]*)\]")
_GIVEN = re.compile(r"Given value: (.*)$", re.MULTILINE)
_SUBCOMMAND = re.compile(r"invalid choice: '([^']*)' \(choose from (.*)\)")


def _class_problem(key: str, class_path: str, problem: str, files: Mapping[str, Path]) -> str:
    short = class_path.rpartition(".")[2]
    option = _OPTION.search(problem)
    if option:
        name = option.group(1)
        where, in_file = _find_manager(files, class_path, name) if key == MANAGERS else (key, _file_with(files, key))
        return (f"{where} ({short}): option '{name}' is not accepted."
                f"{did_you_mean(name, _accepted_arguments(class_path))}{in_file}")
    if _NO_ATTRIBUTE.search(problem):
        module = class_path.rpartition(".")[0]
        try:
            names = [n for n in dir(importlib.import_module(module)) if not n.startswith("_")]
        except ImportError:
            names = []
        where, in_file = _find_manager(files, class_path, None) if key == MANAGERS else (key, _file_with(files, key))
        close = difflib.get_close_matches(short, names, n=1)
        suggestion = f" Did you mean '{module}.{close[0]}'?" if close else ""
        return f"{where}: class_path '{class_path}' cannot be imported.{suggestion}{in_file}"
    return f"{key} ({short}): {problem.strip()}{_file_with(files, key)}"


def describe_parse_error(message: str, dests: Sequence[str], files: Mapping[str, Path],
                         subcommands: Sequence[str] = ()) -> str:
    """The one-line form of a jsonargparse error: config path, what is wrong, and the fix.

    Args:
        message: jsonargparse's error message (several lines, with every subtype it tried).
        dests: The dotted option names the (sub)command's parser accepts.
        files: The ``--config`` files (:func:`config_files`), to name the one that sets the key.
        subcommands: The subcommands the program has (for a misspelt subcommand).

    Returns:
        The message without the ``lightning-tune-data: error:`` prefix.
    """
    for pattern in (_NOT_ACCEPTED, _UNRECOGNIZED):
        found = pattern.search(message)
        if found:
            return _unknown_key(found.group(1), dests, files)
    found = _SUBCOMMAND.search(message)
    if found:
        choices = list(subcommands) or re.findall(r"'([^']+)'", found.group(2))
        return (f"'{found.group(1)}' is not a subcommand; choose one of {', '.join(choices)}."
                f"{did_you_mean(found.group(1), choices)}")
    key_match = _PARSER_KEY.search(message)
    key = key_match.group(1) if key_match else ""
    class_problem = _CLASS_PATH.search(message)
    if key and class_problem:
        return _class_problem(key, class_problem.group(1), class_problem.group(2), files)
    literal = _LITERAL.search(message)
    given = _GIVEN.search(message)
    if key and literal:
        choices = re.findall(r"'([^']*)'", literal.group(1))
        value = given.group(1).strip() if given else "?"
        return (f"{key}: {value!r} is not one of {', '.join(choices)}.{did_you_mean(value, choices)}"
                f"{_file_with(files, key)}")
    if key:
        body = message[key_match.end():].split("Given value type:")[0]
        body = " ".join(body.replace("Does not validate against any of the Union subtypes", "").split())
        body = re.sub(r"<class '([\w.]+)'>", r"\1", body)
        return f"{key}: {body.lstrip(': ')}{_file_with(files, key)}"
    return message.strip().splitlines()[0] if message.strip() else "invalid arguments"


_SOURCE = re.compile(r"^source '(?P<name>[^']+)'")
_WORKER = re.compile(r"Caught \w+ in DataLoader worker process \d+\.")


def _without_source_prefix(text: str) -> tuple[str | None, str, str]:
    """``("a", "<description>", "<rest>")`` for ``"source 'a' (<description>): <rest>"``.

    ``(None, "", text)`` when the text does not start by naming its source.
    """
    found = _SOURCE.match(text)
    if not found:
        return None, "", text
    rest, description = text[found.end():], ""
    if rest.startswith(" ("):
        depth = 0
        for index, char in enumerate(rest[1:], start=1):
            depth += {"(": 1, ")": -1}.get(char, 0)
            if depth == 0:
                description, rest = rest[2:index], rest[index + 1:]
                break
    return found.group("name"), description, rest.removeprefix(":").strip()


def _manager_paths(managers: Any, name: str) -> list[tuple[str, str]]:
    """``(config path, class name)`` of every configured manager called ``name``."""
    found = []
    for split, entries in (managers or {}).items() if isinstance(managers, dict) else ():
        named = entries.items() if isinstance(entries, dict) else enumerate(entries or [])
        for key, spec in named:
            if str(key) == name:
                class_path = spec.get("class_path", "") if isinstance(spec, dict) else type(spec).__name__
                found.append((f"{MANAGERS}.{split}.{key}", str(class_path).rpartition(".")[2]))
    return found


def describe_run_error(error: BaseException, managers: Any) -> str:
    """The one-line form of a data error raised while the run prepares or reads its sources.

    A message that names its source (``source 'a' (<files>): ...``) is re-addressed by the source's
    config path, e.g. ``data.dataset_managers.train.a (LocalDatasetManager, <files>): ...``; an error
    re-raised from a dataloader worker loses the worker's traceback.

    Args:
        error: The error (a data source, preprocessing or cache error).
        managers: The config's ``data.dataset_managers`` as plain dicts (``None``: unknown).
    """
    text = str(error)
    if _WORKER.search(text):
        last = [line for line in text.strip().splitlines() if line.strip()][-1]
        text = last.split(": ", 1)[1] if re.match(r"^[\w.]+(Error|Exception): ", last) else last
    name, description, rest = _without_source_prefix(text.strip())
    paths = _manager_paths(managers, name) if name is not None else []
    if not paths:
        return text
    where = " or ".join(path for path, _ in paths)
    about = ", ".join(part for part in (paths[0][1], description) if part)
    return f"{where} ({about}): {rest}"
