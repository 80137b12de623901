"""Results kept once per file and node."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lightning_tune_data.formats.kept import kept_arrays, kept_folder, kept_path


def test_a_result_is_computed_once_and_memory_mapped_after(tmp_path: Path) -> None:
    calls = []
    folder = kept_folder(tmp_path, "scan", {"url": "/data/a.bin", "size": 10, "stamp": "1"})

    def compute() -> dict[str, np.ndarray]:
        calls.append(1)
        return {"tokens": np.arange(5, dtype=np.uint16)}

    assert kept_arrays(folder, compute)["tokens"].tolist() == [0, 1, 2, 3, 4]
    again = kept_arrays(folder, compute)
    assert len(calls) == 1 and isinstance(again["tokens"], np.memmap)
    path, start = kept_path(folder, "tokens")
    assert np.fromfile(path, dtype=np.uint16, offset=start).tolist() == [0, 1, 2, 3, 4]
    assert kept_folder(tmp_path, "scan", {"url": "/data/a.bin", "size": 10, "stamp": "2"}) != folder


def test_an_unfinished_result_is_not_used(tmp_path: Path) -> None:
    folder = kept_folder(tmp_path, "scan", {"url": "x", "size": 1, "stamp": "1"})
    folder.mkdir(parents=True)
    np.save(folder / "tokens.npy", np.arange(3))  # no done marker: a killed scan
    assert kept_arrays(folder, lambda: {"tokens": np.arange(2)})["tokens"].tolist() == [0, 1]
    assert (folder / "done").is_file()
