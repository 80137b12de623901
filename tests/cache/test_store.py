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
from read_only_dir import read_only

import lightning_tune_data
from lightning_tune_data.cache import checksums
from lightning_tune_data.cache import store as cache
from lightning_tune_data.cache.store import (
    COMPLETE_MARKER,
    build_cache_atomically,
    callable_identity,
    file_identity,
    fingerprint,
    is_valid_cache,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


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
    from lightning_tune_data.cache.store import build_cache_atomically

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
    from lightning_tune_data.cache.store import build_cache_atomically

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


# ------------------------------------------------------------- content identity, checksums


def test_file_identity_follows_the_content_of_every_byte_not_the_mtime(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    payload = bytearray(os.urandom(3 * (1 << 20)))
    path.write_bytes(bytes(payload))
    before = file_identity(path)
    assert before["path"] == str(path.resolve()) and before["size"] == len(payload)
    os.utime(path, ns=(1, 10**18))  # a touch: new mtime, same bytes
    assert file_identity(path) == before
    stat = path.stat()
    payload[len(payload) // 2] ^= 0x01  # one bit in the middle, same size, mtime restored
    path.write_bytes(bytes(payload))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    after = file_identity(path)
    assert after["size"] == before["size"] and after != before


def test_file_identity_remembers_hashes_by_size_mtime_and_inode_in_the_cache_root(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text('{"text": "a"}\n')
    memo_dir = tmp_path / "cache"
    file_identity(path, memo_dir=memo_dir)
    assert not memo_dir.exists()  # the memo never creates the cache root
    memo_dir.mkdir()
    first = file_identity(path, memo_dir=memo_dir)
    memo_file = memo_dir / cache.FILE_HASH_MEMO
    memo = json.loads(memo_file.read_text())
    assert memo[str(path.resolve())]["xxh3_128"] == first["xxh3_128"]
    # An entry whose stamp matches is trusted without reading the file again ...
    memo[str(path.resolve())]["xxh3_128"] = "remembered"
    memo_file.write_text(json.dumps(memo))
    checksums._memo.clear()
    assert file_identity(path, memo_dir=memo_dir)["xxh3_128"] == "remembered"
    # ... and a touch (new mtime) re-hashes the file, finding the real, unchanged content.
    os.utime(path, ns=(1, 10**18))
    assert file_identity(path, memo_dir=memo_dir) == first


def _flip_middle_bit(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def _build_blob(temp_dir: Path) -> None:
    (temp_dir / "part").mkdir()
    (temp_dir / "part" / "blob.bin").write_bytes(bytes(range(256)) * 64)


def test_a_flipped_bit_in_a_cache_file_is_detected_and_rebuilt_with_a_warning_naming_the_file(tmp_path: Path) -> None:
    final = tmp_path / "cache" / "src-1"
    build_cache_atomically(final, _build_blob, {"fp": "1"})
    marker = json.loads((final / COMPLETE_MARKER).read_text())
    assert set(marker["files"]) == {"part/blob.bin"} and "xxh3_128" in marker["files"]["part/blob.bin"]
    _flip_middle_bit(final / "part" / "blob.bin")
    calls: list[str] = []
    with pytest.warns(UserWarning, match=r"Removing invalid cache .*src-1 \(corrupt: file .*part/blob\.bin does not "
                                         r"match the checksum recorded"):
        build_cache_atomically(final, lambda d: (calls.append("rebuilt"), _build_blob(d)), {"fp": "1"})
    assert calls == ["rebuilt"]
    assert (final / "part" / "blob.bin").read_bytes() == bytes(range(256)) * 64


def test_size_only_verification_reuses_a_same_size_corruption_but_catches_truncation(tmp_path: Path) -> None:
    final = tmp_path / "src-1"
    build_cache_atomically(final, _build_blob, {"fp": "1"})
    _flip_middle_bit(final / "part" / "blob.bin")
    calls: list[str] = []
    build_cache_atomically(final, lambda d: calls.append("rebuilt"), {"fp": "1"}, verify_mode="size")
    assert calls == []
    (final / "part" / "blob.bin").write_bytes(b"short")
    assert "has 5 bytes, 16384 were written" in cache.check_complete_cache(final, verify_mode="size")


def test_an_unknown_verification_mode_is_rejected(tmp_path: Path) -> None:
    final = tmp_path / "src-1"
    build_cache_atomically(final, _build_blob, {"fp": "1"})
    with pytest.raises(ValueError, match=r"'fast' is not one of \('checksum', 'size'\)"):
        build_cache_atomically(final, _build_blob, {"fp": "1"}, verify_mode="fast")


# ------------------------------------------------------------------------ read-only caches


def test_a_complete_cache_in_a_read_only_directory_is_used_without_the_lock(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    final = root / "src-1"
    build_cache_atomically(final, _build_blob, {"fp": "1"})
    Path(str(final) + ".lock").unlink()  # e.g. a cache copied into a container image
    with read_only(root):
        assert build_cache_atomically(final, lambda d: pytest.fail("must not build"), {"fp": "1"}) == final
        assert not Path(str(final) + ".lock").exists()


def test_a_build_in_a_read_only_directory_fails_naming_the_directory_and_the_cache_dir_option(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    with read_only(root), pytest.raises(cache.CacheReadOnlyError) as info:
        build_cache_atomically(root / "src-1", _build_blob, {"fp": "1"}, description="source 'notes'")
    message = str(info.value)
    assert message.startswith("source 'notes': the cache src-1 must be built")
    assert f"the cache directory {root} cannot be written" in message and "cache_dir" in message


def test_cache_hits_and_builds_are_one_line_each_at_the_default_log_level(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys
        from pathlib import Path
        from lightning_tune_data.cache.store import build_cache_atomically
        final = Path(sys.argv[1])
        build = lambda d: (d / "x.txt").write_text("x")
        build_cache_atomically(final, build, {"fp": "1"}, description="source 'notes'")
        build_cache_atomically(final, build, {"fp": "1"}, description="source 'notes'")
        """
    )
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path / "notes-1")], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=120, check=True)
    lines = [line for line in result.stderr.splitlines() if line.startswith("source 'notes'")]
    assert len(lines) == 2, result.stderr
    assert "built cache" in lines[0] and "because no cache for this configuration yet" in lines[0]
    assert "using cache" in lines[1] and "checksums checked" in lines[1]
