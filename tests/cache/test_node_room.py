"""The node's shard cache room: every store's files counted, downloads at their final size, dead
downloads removed, files no live reader names evicted first, and a mapped file never deleted."""

from __future__ import annotations

import fcntl
import mmap
import os
from pathlib import Path

from lightning_tune_data.cache.node_room import (
    evict, eviction_order, held_only_by, make_room, node_contents, partial_size,
)
from lightning_tune_data.cache.owners import claim, release
from lightning_tune_data.cache.reader_positions import ReaderPositions


def put(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    return path


def test_every_stores_files_count_and_a_download_counts_at_its_final_size_while_its_owner_lives(tmp_path):
    put(tmp_path / "a-1" / "shards" / "0.aa.arrow", 100)
    put(tmp_path / "b-2" / "shards" / "0.bb.arrow", 200)
    live = tmp_path / "a-1" / "shards" / "1.cc.arrow.partial-5000-abcd1234"
    live.parent.mkdir(parents=True, exist_ok=True)
    owner = claim(live)
    dead = put(tmp_path / "a-1" / "shards" / "2.dd.arrow.partial-7000-deadbeef", 10)  # its owner ended
    put(tmp_path / "a-1" / ".locks" / "x.lock", 1)
    try:
        contents = node_contents(tmp_path)
        assert sorted((item.name, item.size, item.in_progress) for item in contents) == [
            ("shards/0.aa.arrow", 100, False), ("shards/0.bb.arrow", 200, False),
            ("shards/1.cc.arrow.partial-5000-abcd1234", 5000, True)]
        assert not dead.exists()
        assert partial_size(live.name) == 5000
    finally:
        release(owner)


def test_files_no_live_reader_names_go_first_then_this_stores_by_next_use_then_other_live_stores(tmp_path):
    own, other, ended = tmp_path / "a-1", tmp_path / "b-2", tmp_path / "c-3"
    for name in ("0.x.arrow", "1.x.arrow", "stray.x.arrow"):
        put(own / name, 10)
    put(other / "0.y.arrow", 10)
    put(ended / "0.z.arrow", 10)
    reader = ReaderPositions(other)
    reader.publish(0, 0)  # a live job reads store b
    try:
        contents = node_contents(tmp_path)
        named = {"0.x.arrow": 0, "1.x.arrow": 1}
        order = [item.path.relative_to(tmp_path).as_posix()
                 for item in eviction_order(contents, own, named, {0: 1.0, 1: 4.0}.get, None)]
        assert sorted(order[:2]) == ["a-1/stray.x.arrow", "c-3/0.z.arrow"]
        assert order[2:] == ["a-1/1.x.arrow", "a-1/0.x.arrow", "b-2/0.y.arrow"]
        prefetching = eviction_order(contents, own, named, {0: 1.0, 1: 4.0}.get, 2.0)
        assert [item.name for item in prefetching][2:] == ["1.x.arrow"]  # never one needed sooner, nor a live job's
    finally:
        reader.close()


def test_a_file_any_process_maps_is_never_evicted_and_make_room_stops_at_what_fits(tmp_path):
    first, second = put(tmp_path / "a-1" / "0.x.arrow", 4096), put(tmp_path / "a-1" / "1.x.arrow", 4096)
    fd = os.open(first, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    mapping = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)  # the mapping's own descriptor shares the lock
    os.close(fd)
    assert not evict(first) and first.exists()

    fits, used = make_room(tmp_path, 8192, 4096, lambda contents: sorted(contents, key=lambda item: item.name))
    assert (fits, used) == (True, 4096) and first.exists() and not second.exists()
    assert make_room(tmp_path, 4096, 4096, lambda contents: contents) == (False, 4096)
    mapping.close()  # unmapped: the lock goes with it
    assert evict(first) and not first.exists()


def test_held_only_by_names_the_one_process_holding_every_cached_shard(tmp_path):
    import subprocess
    import sys

    shard = put(tmp_path / "a-1" / "0.x.arrow", 4096)
    assert not held_only_by(tmp_path, os.getpid())  # nobody holds it
    fd = os.open(shard, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    assert held_only_by(tmp_path, os.getpid())
    other = put(tmp_path / "b-1" / "0.y.arrow", 4096)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_SH); "
        "print('held', flush=True); time.sleep(60)"), str(other)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert not held_only_by(tmp_path, os.getpid())  # another reader holds a shard: waiting may help
    finally:
        holder.kill()
        holder.wait()
        os.close(fd)
    assert not held_only_by(tmp_path, holder.pid)  # gone, and this process let go too
