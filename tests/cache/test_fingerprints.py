"""Fingerprints: canonical JSON of a cache's inputs, callables described by their code, and the hash."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path

import numpy as np
import pytest

import lightning_tune_data
from lightning_tune_data.cache.fingerprints import (
    CACHE_FORMAT_VERSION,
    callable_identity,
    canonical_json,
    fingerprint,
    json_default,
)


def _load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fingerprint_is_independent_of_key_order_and_stable() -> None:
    a = fingerprint({"source": {"path": "x", "split": "train"}, "tokenizer": "T:v1"})
    b = fingerprint({"tokenizer": "T:v1", "source": {"split": "train", "path": "x"}})
    assert a == b
    assert len(a) == 64 and int(a, 16) >= 0


def test_fingerprint_changes_with_any_part() -> None:
    base = {"source": {"path": "x", "split": "train"}, "tokenizer": "T:v1", "kwargs": {"k": 1}}
    variants = [
        {**base, "tokenizer": "T:v2"},
        {**base, "kwargs": {"k": 2}},
        {**base, "source": {"path": "x", "split": "test"}},
    ]
    prints = {fingerprint(base)} | {fingerprint(v) for v in variants}
    assert len(prints) == 4


def test_fingerprint_includes_package_version(monkeypatch: pytest.MonkeyPatch) -> None:
    before = fingerprint({"a": 1})
    monkeypatch.setattr(lightning_tune_data.version, "__version__", "999.0.0")
    assert fingerprint({"a": 1}) != before


def test_fingerprint_canonicalises_paths_and_sets_and_rejects_unstable_reprs() -> None:
    assert fingerprint({"p": Path("/a/b"), "s": {"y", "x"}}) == fingerprint(
        {"p": "/a/b", "s": ["x", "y"]}
    )
    with pytest.raises(TypeError, match=r"cannot fingerprint a value of type object"):
        fingerprint({"bad": object()})


def test_callable_identity_changes_when_function_source_changes(tmp_path: Path) -> None:
    (tmp_path / "v1").mkdir()
    (tmp_path / "v2").mkdir()
    (tmp_path / "v1" / "mod.py").write_text("def fn(examples, tokenizer):\n    return 1\n")
    (tmp_path / "v2" / "mod.py").write_text("def fn(examples, tokenizer):\n    return 2\n")
    one = callable_identity(_load_module(tmp_path / "v1" / "mod.py", "ltd_idmod").fn)
    two = callable_identity(_load_module(tmp_path / "v2" / "mod.py", "ltd_idmod").fn)
    assert (one["module"], one["qualname"]) == (two["module"], two["qualname"]) == ("ltd_idmod", "fn")
    assert one["source_sha256"] != two["source_sha256"]
    assert fingerprint({"fn": one}) != fingerprint({"fn": two})


def test_callable_identity_of_builtin_has_no_source_but_is_stable() -> None:
    assert callable_identity(len) == callable_identity(len)
    assert callable_identity(len)["source_sha256"] is None


def test_fingerprint_of_fixed_parts_is_the_recorded_value(monkeypatch: pytest.MonkeyPatch) -> None:
    # Caches built before must be found again: the hash of the same parts never changes.
    monkeypatch.setattr(lightning_tune_data.version, "__version__", "0.2.0")
    parts = {"manager": "M", "source": {"path": "x", "split": "train"}, "tokenizer": "T:v1"}
    assert CACHE_FORMAT_VERSION == 2
    assert canonical_json(parts) == '{"manager":"M","source":{"path":"x","split":"train"},"tokenizer":"T:v1"}'
    assert fingerprint(parts) == "9f43c86ed3262fa7574e9fa09b8d7e4fa9a69a7f493c9152ec12f4b389c10239"


def test_callable_identity_of_a_partial_records_its_function_and_bound_arguments() -> None:
    identity = callable_identity(functools.partial(_load_module, name="x"))
    assert identity["partial"] == callable_identity(_load_module)
    assert (identity["args"], identity["keywords"]) == ([], {"name": "x"})


def test_callable_identity_of_a_callable_object_describes_its_class() -> None:
    class Scale:
        def __call__(self, value: int) -> int:
            return 2 * value

    identity = callable_identity(Scale())
    assert identity["qualname"].endswith("Scale") and identity["source_sha256"] is not None


def test_json_default_turns_paths_bytes_numpy_scalars_and_callables_into_json_values() -> None:
    assert json_default(Path("/a/b")) == "/a/b"
    assert json_default(b"\x01\xff") == "01ff"
    assert json_default(np.int64(7)) == 7 and isinstance(json_default(np.int64(7)), int)
    assert json_default(frozenset({"b", "a"})) == ["a", "b"]
    assert json_default(len) == callable_identity(len)
    assert json_default(1 + 2j) == {"repr": "(1+2j)", "type": "builtins.complex"}
