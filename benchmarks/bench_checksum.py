"""Cost of verifying a cache's checksums, per GB, against a plain read of the same bytes.

``prepare_data`` hashes every file of a reused cache (``cache_verify="checksum"``, the default)
and compares it with the xxHash recorded when the cache was written. This measures that check
on a real cache layout written by ``build_cache_atomically`` and, in the same run, a plain
sequential read of the same files with the same chunk size, so the ratio shows what the hash
adds to the read that any check must do. Both are measured warm (the files are in the page
cache after the first pass), which is the upper bound of the hashing cost; on a cold disk the
read dominates and the ratio moves toward 1.

Usage: python benchmarks/bench_checksum.py [--gb 1.0] [--repeats 3] [--data-dir DIR] [--output FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import lightning_tune_data.cache as cache  # noqa: E402
from lightning_tune_data.cache.checksums import READ_CHUNK_BYTES as _CHUNK  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent


def write_cache(root: Path, gigabytes: float, files: int = 4) -> Path:
    """A real cache (marker with checksums) of ``files`` random files totalling ``gigabytes``."""
    per_file = int(gigabytes * 1e9 / files)
    block = os.urandom(1 << 20)

    def build(temp_dir: Path) -> None:
        (temp_dir / "dataset").mkdir()
        for index in range(files):
            with open(temp_dir / "dataset" / f"data-{index:05d}-of-{files:05d}.arrow", "wb") as handle:
                left = per_file
                while left > 0:
                    handle.write(block[: min(left, len(block))])
                    left -= len(block)

    return cache.build_cache_atomically(root / "bench-0000000000000000", build, {"fp": "bench"})


def plain_read(root: Path) -> int:
    buffer = bytearray(_CHUNK)
    total = 0
    for path in sorted((root / "dataset").iterdir()):
        with open(path, "rb", buffering=0) as handle:
            while read := handle.readinto(buffer):
                total += read
    return total


def timed(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=1.0, help="cache size in GB (default 1.0)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data-dir", default=str(BENCH_DIR / ".data" / "checksum"))
    parser.add_argument("--output", default=None, help="write a markdown report here (default: print only)")
    args = parser.parse_args()
    root = Path(args.data_dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    try:
        final = write_cache(root, args.gb)
        size = cache.tree_size(final / "dataset")
        gb = size / 1e9
        plain_read(final)  # warm the page cache for both measurements
        read_s = statistics.median(timed(lambda: plain_read(final), args.repeats))
        check_s = statistics.median(timed(lambda: cache.check_complete_cache(final), args.repeats))
        size_s = statistics.median(timed(lambda: cache.check_complete_cache(final, verify_mode="size"), args.repeats))
        assert cache.check_complete_cache(final) is None
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lines = [
        "# Checksum verification cost",
        "",
        f"Command: `python benchmarks/bench_checksum.py --gb {args.gb} --repeats {args.repeats}`; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} logical CPUs, Python "
        f"{platform.python_version()}; files in the page cache (warm), median of {args.repeats}.",
        "",
        "| check | seconds for the cache | seconds per GB | GB/s | vs. plain read |",
        "|---|---|---|---|---|",
        f"| plain sequential read (baseline) | {read_s:.3f} | {read_s / gb:.3f} | {gb / read_s:.2f} | 1.00 |",
        f"| `cache_verify=\"checksum\"` (xxh3_128 of every byte) | {check_s:.3f} | {check_s / gb:.3f} | "
        f"{gb / check_s:.2f} | {check_s / read_s:.2f} |",
        f"| `cache_verify=\"size\"` (sizes only) | {size_s:.4f} | {size_s / gb:.4f} | - | {size_s / read_s:.3f} |",
        "",
        f"Cache: {size / 1e9:.2f} GB in 4 files. The checksum check runs once per node in `prepare_data` "
        "when a cache is reused (not in `setup` on every rank).",
    ]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.output:
        Path(args.output).write_text(report)


if __name__ == "__main__":
    main()
