"""Fingerprints, file identities and the crash-safe, lock-guarded cache writer."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import lightning_tune_data
from lightning_tune_data import cache
from lightning_tune_data.cache import (
    COMPLETE_MARKER,
    build_cache_atomically,
    callable_identity,
    file_identity,
    fingerprint,
    is_valid_cache,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


def _load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_file_build(content: str, calls: list[str]):
    def build(temp_dir: Path) -> None:
        calls.append(str(temp_dir))
        (temp_dir / "data.txt").write_text(content)

    return build


# ----------------------------------------------------------------------------- fingerprints


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
    monkeypatch.setattr(lightning_tune_data, "__version__", "999.0.0")
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


def test_file_identity_detects_same_size_edits_even_with_restored_mtime(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    payload = bytearray(os.urandom(3 * (1 << 20)))
    path.write_bytes(bytes(payload))
    before = file_identity(path)
    assert before["path"] == str(path.resolve())
    assert before["size"] == len(payload)
    stat = path.stat()
    payload[-1] ^= 0xFF  # last byte: inside the hashed tail MiB
    path.write_bytes(bytes(payload))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = file_identity(path)
    assert after["mtime_ns"] == before["mtime_ns"] and after["size"] == before["size"]
    assert after["head_tail_sha256"] != before["head_tail_sha256"]


def test_file_identity_of_missing_file_raises_naming_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.jsonl"):
        file_identity(tmp_path / "nope.jsonl")


# --------------------------------------------------------------------------- atomic builds


def test_build_cache_atomically_builds_once_and_reuses_the_valid_cache(tmp_path: Path) -> None:
    final = tmp_path / "cache" / "src-abc"
    calls: list[str] = []
    assert build_cache_atomically(final, _write_file_build("v1", calls), {"fp": "abc"}) == final
    assert build_cache_atomically(final, _write_file_build("v2", calls), {"fp": "abc"}) == final
    assert len(calls) == 1
    assert (final / "data.txt").read_text() == "v1"
    assert is_valid_cache(final) and is_valid_cache(final, {"fp": "abc"})
    assert json.loads((final / COMPLETE_MARKER).read_text())["metadata"] == {"fp": "abc"}
    # Only the cache and its lock remain: the temporary directory was renamed into place.
    assert sorted(p.name for p in final.parent.iterdir()) == ["src-abc", "src-abc.lock"]


def test_build_cache_atomically_rebuilds_on_metadata_mismatch_with_warning(tmp_path: Path) -> None:
    final = tmp_path / "src"
    calls: list[str] = []
    build_cache_atomically(final, _write_file_build("old", calls), {"fp": "1"})
    assert not is_valid_cache(final, {"fp": "2"})
    with pytest.warns(UserWarning, match=r"metadata mismatch"):
        build_cache_atomically(final, _write_file_build("new", calls), {"fp": "2"})
    assert len(calls) == 2
    assert (final / "data.txt").read_text() == "new"


def test_directory_without_marker_is_invalid_and_replaced_with_warning(tmp_path: Path) -> None:
    final = tmp_path / "src"
    final.mkdir()
    (final / "data.txt").write_text("half-written")
    assert not is_valid_cache(final)
    calls: list[str] = []
    with pytest.warns(UserWarning, match=r"Removing invalid cache .*no valid _COMPLETE.json"):
        build_cache_atomically(final, _write_file_build("complete", calls), {"fp": "1"})
    assert calls and (final / "data.txt").read_text() == "complete"


def test_corrupt_or_foreign_format_marker_is_invalid(tmp_path: Path) -> None:
    final = tmp_path / "src"
    final.mkdir()
    (final / COMPLETE_MARKER).write_text("{not json")
    assert not is_valid_cache(final)
    (final / COMPLETE_MARKER).write_text(json.dumps({"cache_format": -1, "metadata": {}}))
    assert not is_valid_cache(final)
    assert not is_valid_cache(tmp_path / "does-not-exist")


def test_failing_build_leaves_no_cache_and_no_temporary_directory(tmp_path: Path) -> None:
    final = tmp_path / "src"

    def build(temp_dir: Path) -> None:
        (temp_dir / "partial.arrow").write_bytes(b"x" * 100)
        raise RuntimeError("tokenizer exploded")

    with pytest.raises(RuntimeError, match="tokenizer exploded"):
        build_cache_atomically(final, build, {"fp": "1"})
    assert not final.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["src.lock"]


_KILLED_BUILD_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from lightning_tune_data.cache import build_cache_atomically

    final, ready = Path(sys.argv[1]), Path(sys.argv[2])

    def build(temp_dir):
        # Everything but the marker is written, then the process is killed.
        (temp_dir / "data.txt").write_text("written before the kill")
        ready.write_text(str(temp_dir))
        time.sleep(120)

    build_cache_atomically(final, build, {"fp": "1"})
    """
)


def _start_and_wait_for(script: str, args: list[str], ready: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", script, *args], cwd=REPO_ROOT)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None:
            raise AssertionError(f"build process exited early with {proc.returncode}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("build process never started building")
        time.sleep(0.05)
    return proc


def test_build_killed_with_sigkill_leaves_nothing_valid_and_next_run_rebuilds(tmp_path: Path) -> None:
    final = tmp_path / "src"
    ready = tmp_path / "ready"
    proc = _start_and_wait_for(_KILLED_BUILD_SCRIPT, [str(final), str(ready)], ready)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL

    leftover = Path(ready.read_text())
    assert (leftover / "data.txt").exists()  # the kill really happened mid-build
    assert not final.exists() and not is_valid_cache(final)
    assert not is_valid_cache(leftover)

    calls: list[str] = []
    # The killed process's lock died with it: this does not wait.
    build_cache_atomically(final, _write_file_build("rebuilt", calls), {"fp": "1"}, lock_timeout=30)
    assert len(calls) == 1
    assert (final / "data.txt").read_text() == "rebuilt"
    assert not leftover.exists()  # the stale temporary directory was cleaned up


_CONCURRENT_BUILD_SCRIPT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from lightning_tune_data.cache import build_cache_atomically

    final, log = Path(sys.argv[1]), Path(sys.argv[2])

    def build(temp_dir):
        with open(log, "a") as handle:
            handle.write("build\\n")
        time.sleep(1.0)
        (temp_dir / "data.txt").write_text("built once")

    print(build_cache_atomically(final, build, {"fp": "1"}, lock_timeout=60))
    """
)


def test_concurrent_builders_build_once_and_both_get_the_cache(tmp_path: Path) -> None:
    final = tmp_path / "src"
    log = tmp_path / "builds.log"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _CONCURRENT_BUILD_SCRIPT, str(final), str(log)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [proc.communicate(timeout=120)[0].strip() for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0]
    assert outputs == [str(final), str(final)]
    assert log.read_text().count("build") == 1
    assert (final / "data.txt").read_text() == "built once"


def test_read_cache_metadata_returns_marker_of_complete_cache(tmp_path: Path) -> None:
    final = tmp_path / "src"
    build_cache_atomically(final, _write_file_build("x", []), {"fp": "7", "n": [1, 2]})
    content = cache.read_cache_metadata(final)
    assert content["metadata"] == {"fp": "7", "n": [1, 2]}
    assert content["package_version"] == lightning_tune_data.__version__
    assert cache.read_cache_metadata(tmp_path / "missing") is None
