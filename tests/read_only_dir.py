"""A directory tree that really cannot be written, even by root (the tests run as root).

Root ignores permission bits, so for root the tree is made immutable with ``chattr +i`` (ext4,
xfs, btrfs: even root then gets ``EPERM`` on any create, delete or write); for other users
the write bits are removed. Either way the helper first checks that a write really fails, so
a test using it cannot pass by accident on a writable directory.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path


def _set(path: Path, read_only: bool) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-R", "+i" if read_only else "-i", str(path)], check=True,
                       capture_output=True, text=True)
        return
    for root, dirs, files in os.walk(path):
        for name in [root, *(os.path.join(root, f) for f in files)]:
            mode = os.stat(name).st_mode
            os.chmod(name, mode & ~0o222 if read_only else mode | stat.S_IWUSR)


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """Make ``path`` (a directory tree) unwritable for the duration of the block."""
    _set(path, True)
    try:
        probe = path / ".write-probe"
        try:
            probe.write_text("x")
        except OSError:
            pass
        else:
            probe.unlink()
            raise AssertionError(f"{path} is still writable; this filesystem cannot make it read-only")
        yield path
    finally:
        _set(path, False)
