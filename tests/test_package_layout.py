"""The package's layout rules, checked over every module: rooms small enough to live in, names
defined once, no private name borrowed across folders, and a test file for every module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "lightning_tune_data"
MAX_FILE_LINES = 400
MAX_CLASS_LINES = 250

#: Modules whose behaviour is exercised by a test file not named after them (module -> test file).
COVERED_BY = {
    "__init__.py": "tests/suites/test_readme.py",
    "__main__.py": "tests/cli/test_cli.py",
    "version.py": "tests/cache/test_store.py",
    "distributed.py": "tests/suites/test_reliability_distributed.py",
    "collate/__init__.py": "tests/collate/test_collate.py",
    "collate/base.py": "tests/collate/test_collate.py",
    "collate/padded.py": "tests/collate/test_collate.py",
    "collate/packed.py": "tests/collate/test_collate.py",
    "collate/provenance.py": "tests/packing/test_packed_hot_path.py",
    "cli/__init__.py": "tests/cli/test_cli.py",
    "cli/progress.py": "tests/cli/test_cli.py",
    "commands/__init__.py": "tests/cli/test_cli.py",
    "managers/base.py": "tests/managers/test_managers.py",
    "managers/config.py": "tests/managers/test_managers.py",
    "managers/preprocessing.py": "tests/managers/test_managers.py",
    "packing/strategies/__init__.py": "tests/packing/test_strategies.py",
    "packing/strategies/base.py": "tests/packing/test_strategies.py",
    "packing/strategies/greedy.py": "tests/packing/test_strategies.py",
    "packing/strategies/best_fit.py": "tests/packing/test_strategies.py",
    "packing/strategies/concat.py": "tests/packing/test_strategies.py",
    "tokenizers/__init__.py": "tests/tokenizers/test_tokenizers.py",
}


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _folder_of_module(module: str) -> str:
    """``lightning_tune_data.sources.arrow`` -> ``sources``; a root module (``keys``) -> ``""``."""
    parts = module.split(".")[1:]
    return parts[0] if parts and (PACKAGE / parts[0]).is_dir() else ""


def _folder_of_file(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else ""


def test_no_module_is_longer_than_the_limit() -> None:
    long = {_relative(p): n for p in _modules() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_FILE_LINES}
    assert not long, f"modules over {MAX_FILE_LINES} lines (split them by concept): {long}"


def test_no_class_is_longer_than_the_limit() -> None:
    long = {}
    for path in _modules():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ClassDef) and (size := node.end_lineno - node.lineno + 1) > MAX_CLASS_LINES:
                long[f"{_relative(path)}:{node.name}"] = size
    assert not long, f"classes over {MAX_CLASS_LINES} lines (compose smaller objects): {long}"


def test_no_private_name_is_imported_from_another_folder() -> None:
    crossings = []
    for path in _modules():
        here = _folder_of_file(path)
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lightning_tune_data"):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if private and _folder_of_module(node.module) != here:
                    crossings.append(f"{_relative(path)}: from {node.module} import {', '.join(private)}")
    assert not crossings, "private names used across folders (make the shared name public):\n" + "\n".join(crossings)


def test_no_module_imports_the_package_root() -> None:
    offenders = []
    for path in _modules():
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and (node.level > 0 or node.module == "lightning_tune_data"):
                offenders.append(f"{_relative(path)}:{node.lineno}")
            if isinstance(node, ast.Import) and any(a.name == "lightning_tune_data" for a in node.names):
                offenders.append(f"{_relative(path)}:{node.lineno}")
    assert not offenders, f"relative or package-root imports (import the defining module instead): {offenders}"


def _constant_values(node: ast.AST) -> object:
    try:
        return ast.literal_eval(node)
    except ValueError:
        return None


@pytest.mark.parametrize("name", ["IGNORE_INDEX", "OVERLONG_POLICIES", "STOPPING_STRATEGIES", "MIX_BY", "PROVENANCE_FIELDS"])
def test_shared_names_are_assigned_in_the_keys_module_only(name: str) -> None:
    owners = []
    for path in _modules():
        for node in ast.walk(_tree(path)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                owners.append(_relative(path))
    assert owners == ["keys.py"], f"{name} is assigned in {owners}; define it once in keys.py and import it"


def test_no_module_copies_a_list_of_allowed_values() -> None:
    from lightning_tune_data.keys import MIX_BY, OVERLONG_POLICIES, STOPPING_STRATEGIES
    from lightning_tune_data.packing import strategy_names

    allowed = {tuple(OVERLONG_POLICIES), tuple(STOPPING_STRATEGIES), tuple(MIX_BY), tuple(strategy_names())}
    copies = []
    for path in _modules():
        if path.name == "keys.py":
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.Tuple, ast.List)) and len(node.elts) > 1:
                value = _constant_values(node)
                if isinstance(value, (tuple, list)) and all(isinstance(v, str) for v in value) and tuple(value) in allowed:
                    copies.append(f"{_relative(path)}:{node.lineno} {tuple(value)}")
    assert not copies, f"copied lists of allowed values (import them from keys or the strategy registry): {copies}"


def _only_reexports(path: Path) -> bool:
    """True for a module made of a docstring, imports and ``__all__`` alone."""
    for node in _tree(path).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["__all__"]:
            continue
        return False
    return True


def test_every_module_has_a_test_file_named_after_it_or_a_named_suite() -> None:
    missing = []
    for path in _modules():
        module = _relative(path)
        if path.name == "__init__.py" and path.parent != PACKAGE and _only_reexports(path):
            continue  # a folder's list of public names is covered by its modules' tests
        folder = REPO / "tests" / Path(module).parent
        # test file names are unique across tests/, so a common stem may carry its folder's name
        named = [folder / f"test_{path.stem}.py", folder / f"test_{folder.name}_{path.stem}.py"]
        covering = COVERED_BY.get(module)
        if not any(n.is_file() for n in named) and not (covering and (REPO / covering).is_file()):
            missing.append(module)
    assert not missing, f"modules without a test file named after them or a suite in COVERED_BY: {missing}"
