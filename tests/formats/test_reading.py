"""Opening any format: what the readers cannot check alone (one dtype, some document, the format asked for)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenized_writers import EOS, documents, write_datatrove, write_megatron

from lightning_tune_data.formats.files import CorpusFiles
from lightning_tune_data.formats.options import FormatOptions
from lightning_tune_data.formats.reading import READERS, open_corpus


def opened(folder: Path, format: str = "auto", **options):
    files = CorpusFiles(str(folder), None, folder.parent / "node", "source 'x'")
    return open_corpus(files, format, FormatOptions("source 'x'", folder.parent / "node", **options))


def test_every_format_has_a_reader() -> None:
    assert set(READERS) == {"megatron", "datatrove", "dolma", "nanogpt", "llmc", "litdata", "mds"}


def test_an_empty_corpus_fails(tmp_path: Path) -> None:
    write_megatron(tmp_path / "corpus" / "a", [])
    with pytest.raises(ValueError, match=r"hold no document \(empty corpus\)"):
        opened(tmp_path / "corpus")


def test_several_dtypes_fail_naming_a_file_of_each(tmp_path: Path) -> None:
    write_datatrove(tmp_path / "corpus", "000.ds", documents(3, seed=1), token_size=2)
    write_datatrove(tmp_path / "corpus", "001.ds", documents(3, seed=2), token_size=4)
    with pytest.raises(ValueError, match=r"several dtypes \(\{'uint16': '.*000\.ds', 'uint32': '.*001\.ds'\}\)"):
        opened(tmp_path / "corpus")


def test_a_format_given_with_none_of_its_files_fails(tmp_path: Path) -> None:
    write_megatron(tmp_path / "corpus" / "a", documents(3, seed=1))
    with pytest.raises(ValueError, match=r"format='mds' but no mds file is at .*found 2 megatron"):
        opened(tmp_path / "corpus", "mds", eos_id=EOS)
