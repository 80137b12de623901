"""Where a node's shard cache may live: refused on a network filesystem or a disk smaller than
the budget, at setup, naming the folder and the fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lightning_tune_data.cache.local_disk import (
    NETWORK_FILESYSTEMS, check_shard_cache_disk, filesystem_magic, network_filesystem,
)

TMPFS_MAGIC = 0x01021994


@pytest.mark.parametrize(("magic", "name"), [(0x6969, "NFS"), (0xFF534D42, "CIFS"), (0xFE534D42, "SMB2"),
                                             (0x0BD00BD0, "Lustre"), (0x47504653, "GPFS"), (0x19830326, "BeeGFS"),
                                             (0x65735546, "FUSE"), (TMPFS_MAGIC, None), (0xEF53, None)])
def test_network_filesystems_are_told_from_local_ones_by_their_statfs_magic(magic, name):
    assert network_filesystem(magic) == name


def test_statfs_reads_the_magic_of_a_real_mount():
    mounts = {line.split()[1]: line.split()[2] for line in Path("/proc/mounts").read_text().splitlines()}
    tmpfs = next(point for point, kind in mounts.items() if kind == "tmpfs" and os.access(point, os.R_OK))
    assert filesystem_magic(tmpfs) == TMPFS_MAGIC
    assert network_filesystem(filesystem_magic("/proc")) is None


def test_a_local_disk_with_room_is_accepted_even_before_the_folder_exists(tmp_path):
    check_shard_cache_disk(tmp_path / "not" / "yet", 1 << 20, 0, "source 'a'")


def test_a_budget_beyond_the_free_space_is_refused_naming_the_folder_and_the_fix(tmp_path):
    stats = os.statvfs(tmp_path)
    free = stats.f_bavail * stats.f_frsize
    with pytest.raises(ValueError, match=rf"source 'a': cache_budget .* local_cache_dir {tmp_path} .*Lower cache_budget"):
        check_shard_cache_disk(tmp_path, free + (1 << 40), 0, "source 'a'")
    check_shard_cache_disk(tmp_path, free + (1 << 20), 2 << 20, "source 'a'")  # what the cache holds counts as room


def test_a_network_filesystem_is_refused_naming_it_and_the_fix(tmp_path, monkeypatch):
    fuse = next((line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                 if line.split()[2].startswith(("fuse", "nfs", "cifs"))), None)
    if fuse is not None and os.access(fuse, os.R_OK):
        folder = Path(fuse)
    else:  # no network mount on this machine: the check reads this magic number as a real NFS mount would give
        import lightning_tune_data.cache.local_disk as local_disk

        monkeypatch.setattr(local_disk, "filesystem_magic", lambda path: 0x6969)
        folder = tmp_path
    with pytest.raises(ValueError, match=rf"local_cache_dir {folder} is on a network filesystem \((NFS|FUSE|CIFS|SMB\w*)\)"
                                         r".*Point local_cache_dir at the node's local disk"):
        check_shard_cache_disk(folder, 1, 0, "source 'a'")
    assert set(NETWORK_FILESYSTEMS.values()) >= {"NFS", "CIFS", "Lustre", "GPFS", "BeeGFS", "FUSE"}
