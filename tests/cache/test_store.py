"""The crash-safe, lock-guarded cache writer."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from read_only_dir import read_only

from lightning_tune_data.cache.marker import COMPLETE_MARKER, is_valid_cache
from lightning_tune_data.cache.store import CacheReadOnlyError, build_cache_atomically, check_complete_cache

REPO_ROOT = Path(__file__).resolve().parents[2]


def _write_file_build(content: str, calls: list[str]):
    def build(temp_dir: Path) -> None:
        calls.append(str(temp_dir))
        (temp_dir / "data.txt").write_text(content)

    return build


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
    assert "has 5 bytes, 16384 were written" in check_complete_cache(final, verify_mode="size")


def test_an_unknown_verification_mode_is_rejected(tmp_path: Path) -> None:
    final = tmp_path / "src-1"
    build_cache_atomically(final, _build_blob, {"fp": "1"})
    with pytest.raises(ValueError, match=r"'fast' is not one of \('checksum', 'size', 'full'\)"):
        build_cache_atomically(final, _build_blob, {"fp": "1"}, verify_mode="fast")


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
    with read_only(root), pytest.raises(CacheReadOnlyError) as info:
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
