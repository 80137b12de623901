"""Tokenizer files: the content hash behind a tokenizer's identity, and the optional libraries."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from lightning_tune_data.tokenizers.files import INSTALL_HINT, TOKENIZER_FILE_NAMES, import_optional, sha256_files


def test_sha256_files_hashes_each_name_and_content_in_the_given_order(tmp_path: Path) -> None:
    (tmp_path / "vocab.json").write_bytes(b"{}")
    (tmp_path / "merges.txt").write_bytes(b"a b\n")
    paths = [str(tmp_path / "merges.txt"), str(tmp_path / "vocab.json")]
    expected = hashlib.sha256(b"merges.txt\0a b\n\0vocab.json\0{}\0").hexdigest()
    assert sha256_files(paths) == expected
    assert sha256_files(list(reversed(paths))) != expected
    # Only names and bytes count: the same file elsewhere hashes the same.
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "vocab.json").write_bytes(b"{}")
    assert sha256_files([str(tmp_path / "copy" / "vocab.json")]) == sha256_files([str(tmp_path / "vocab.json")])


def test_tokenizer_file_names_leave_model_weights_out() -> None:
    assert {"tokenizer.json", "tokenizer_config.json", "tokenizer.model"} <= TOKENIZER_FILE_NAMES
    assert not {"model.safetensors", "config.json", "pytorch_model.bin"} & TOKENIZER_FILE_NAMES


def test_import_optional_returns_the_library_or_says_how_to_install_it() -> None:
    assert import_optional("tokenizers", "TokenizerFileTokenizer").__name__ == "tokenizers"
    with pytest.raises(ImportError, match=r"SomeTokenizer needs the optional 'no_such_library_xyz' package") as info:
        import_optional("no_such_library_xyz", "SomeTokenizer")
    assert INSTALL_HINT in str(info.value)
