"""Many small remote reads at once: on S3 one conditional GET per file (a file replaced since it
was listed is named, not read), elsewhere plain reads the caller checks after."""

from __future__ import annotations

from pathlib import Path

import fsspec
import pytest

from lightning_tune_data.formats.files import CorpusFiles
from lightning_tune_data.formats.remote_reads import CONCURRENT_REQUESTS, ChangedFile, pooled_options, read_checked


def test_on_s3_each_file_costs_one_conditional_get_and_a_replaced_one_is_named(tmp_path: Path, s3) -> None:
    for number in range(12):
        s3.put(f"small/f{number:02d}.idx", bytes([number]) * (10 + number))
    files = CorpusFiles(f"{s3.url}/small/", s3.storage_options, tmp_path, "source 'x'")
    listing = files.listing()
    fs = files._fs()
    assert fs.config_kwargs["max_pool_connections"] == CONCURRENT_REQUESTS
    before = len(s3.requests.log)
    reads = [(name, None, None, info["stamp"]) for name, info in listing.items()]
    data, checked = read_checked(fs, reads + [(reads[3][0], 2, 6, reads[3][3])])
    assert checked and data == [bytes([n]) * (10 + n) for n in range(12)] + [bytes([3]) * 4]
    served = s3.requests.log[before:]
    assert len(served) == 13 and {method for method, _ in served} == {"GET"}  # no HEAD, no listing
    before = len(s3.requests.log)
    assert read_checked(fs, [(reads[0][0], None, None, "2026-11-28 07:00:00+00:00")]) == ([bytes([0]) * 10], False)
    assert len(s3.requests.log) == before + 1  # a store listing no ETag: a plain read, the caller checks after
    s3.put("small/f05.idx", b"new bytes")
    with pytest.raises(ChangedFile, match=r"small/f05\.idx"):
        read_checked(fs, reads)


def test_elsewhere_reads_are_plain_and_left_to_the_caller_to_check(tmp_path: Path) -> None:
    (tmp_path / "a.idx").write_bytes(b"0123456789")
    (tmp_path / "b.idx").write_bytes(b"abcdef")
    fs = fsspec.filesystem("file")
    paths = [str(tmp_path / "a.idx"), str(tmp_path / "b.idx")]
    assert read_checked(fs, [(path, None, None, "x") for path in paths]) == ([b"0123456789", b"abcdef"], False)
    assert read_checked(fs, [(paths[0], 2, 5, "x"), (paths[1], 0, 2, "x")]) == ([b"234", b"ab"], False)
    assert read_checked(fs, []) == ([], True)


def test_s3_options_get_a_pool_for_the_requests_in_flight_unless_one_was_chosen() -> None:
    assert pooled_options("s3", {"key": "k"}) == {"key": "k", "config_kwargs": {"max_pool_connections": 64}}
    chosen = {"config_kwargs": {"max_pool_connections": 8, "read_timeout": 5}}
    assert pooled_options("s3", chosen) == chosen
    assert pooled_options("gs", {"token": "t"}) == {"token": "t"}
