"""format: auto: each format found from its files; unknown and mixed layouts named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenized_writers import EOS, documents, write_datatrove, write_litdata, write_llmc, write_mds, write_megatron, write_raw

from lightning_tune_data.formats.detect import detect_format
from lightning_tune_data.formats.files import CorpusFiles


def detected(folder: Path) -> str:
    return detect_format(CorpusFiles(str(folder), None, folder / "node", "source 'x'"), "source 'x'")


def test_every_format_is_detected_from_its_files(tmp_path: Path) -> None:
    docs = documents(8, seed=17)
    write_megatron(tmp_path / "megatron" / "a", docs)
    write_datatrove(tmp_path / "datatrove", "000.ds", docs)
    write_raw(tmp_path / "dolma" / "part-0.npy", docs)
    write_raw(tmp_path / "nanogpt" / "train.bin", docs)
    write_llmc(tmp_path / "llmc", [np.concatenate([[EOS], d]) for d in docs], 50)
    write_litdata(tmp_path / "litdata", docs, tokens_loader=True)
    write_mds(tmp_path / "mds", docs, "zstd")
    (tmp_path / "mds" / "README.md").write_text("notes are ignored")
    for name in ("megatron", "datatrove", "dolma", "nanogpt", "llmc", "litdata", "mds"):
        assert detected(tmp_path / name) == name


def test_mixed_and_unknown_layouts_fail_naming_what_was_found(tmp_path: Path) -> None:
    write_megatron(tmp_path / "mixed" / "a", documents(3, seed=1))
    write_datatrove(tmp_path / "mixed", "000.ds", documents(3, seed=2))
    with pytest.raises(ValueError, match=r"mix formats: 3 datatrove file\(s\) .*2 megatron file\(s\)"):
        detected(tmp_path / "mixed")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "data.parquet").write_bytes(b"PAR1")
    with pytest.raises(ValueError, match=r"no known tokenized format .*1 unknown file\(s\) \(e\.g\. .*data\.parquet\)"):
        detected(tmp_path / "other")
