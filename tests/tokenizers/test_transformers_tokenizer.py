"""TransformersTokenizer: a local ``transformers`` ``save_pretrained`` directory, loaded through the adapter."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import pytest
from bpe_tokenizers import TEXTS, pretrained_dir, raw_tokenizer, tokenizer_json, train_bpe  # noqa: F401 - fixtures
from jsonargparse import ArgumentParser
from tokenizers import Tokenizer as RawTokenizer
from transformers import PreTrainedTokenizerFast

from lightning_tune_data.tokenizers import TOKENIZER_FILE_NAMES, Tokenizer, TokenizerFileTokenizer, TransformersTokenizer


@pytest.mark.parametrize("text", TEXTS)
def test_transformers_tokenizer_round_trips_text_including_non_ascii(
    pretrained_dir: Path, text: str
) -> None:
    tokenizer = TransformersTokenizer(str(pretrained_dir))
    ids = tokenizer.encode(text)
    assert all(isinstance(i, int) and 0 <= i < tokenizer.vocab_size for i in ids)
    assert tokenizer.decode(ids) == text


def test_transformers_tokenizer_matches_the_tokenizer_file_without_special_tokens(
    pretrained_dir: Path, tokenizer_json: Path
) -> None:
    hf = TransformersTokenizer(str(pretrained_dir))
    file_based = TokenizerFileTokenizer(str(tokenizer_json))
    for text in TEXTS:
        assert hf.encode(text) == file_based.encode(text)
    assert (hf.bos_id, hf.eos_id, hf.pad_id) == (file_based.bos_id, file_based.eos_id, file_based.pad_id)
    assert hf.vocab_size == file_based.vocab_size
    assert isinstance(hf, Tokenizer)


def test_transformers_tokenizer_prefers_its_declared_special_tokens(
    tmp_path: Path,
) -> None:
    raw = train_bpe(["<s>", "</s>", "<|doc_end|>"], add_template=False)
    fast = PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>", eos_token="<|doc_end|>")
    fast.save_pretrained(str(tmp_path / "tok"))
    tokenizer = TransformersTokenizer(str(tmp_path / "tok"))
    assert tokenizer.eos_id == raw.token_to_id("<|doc_end|>")
    assert tokenizer.pad_id == tokenizer.eos_id  # no pad token declared or present


def test_transformers_tokenizer_with_unknown_explicit_token_raises_naming_it(
    pretrained_dir: Path,
) -> None:
    with pytest.raises(ValueError, match=r"bos_token='\[NOPE\]' is not in the tokenizer's vocabulary"):
        TransformersTokenizer(str(pretrained_dir), bos_token="[NOPE]")


def test_transformers_tokenizer_without_eos_raises_naming_the_token_and_the_fix(tmp_path: Path) -> None:
    raw = train_bpe(["<s>"], add_template=False)
    PreTrainedTokenizerFast(tokenizer_object=raw, bos_token="<s>").save_pretrained(str(tmp_path / "t"))
    with pytest.raises(ValueError, match="no EOS token") as info:
        TransformersTokenizer(str(tmp_path / "t"))
    assert "eos_token=" in str(info.value)


def test_transformers_tokenizer_rejects_a_path_without_tokenizer_files(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="save_pretrained"):
        TransformersTokenizer(str(tmp_path))


def test_transformers_tokenizer_identity_follows_tokenizer_files_only(pretrained_dir: Path) -> None:
    original = TransformersTokenizer(str(pretrained_dir))
    assert original.identity.startswith("TransformersTokenizer:")

    (pretrained_dir / "model.safetensors").write_bytes(b"weights are not tokenizer files")
    assert TransformersTokenizer(str(pretrained_dir)).identity == original.identity

    edited = RawTokenizer.from_file(str(pretrained_dir / "tokenizer.json"))
    edited.add_tokens(["<|new_token|>"])
    edited.save(str(pretrained_dir / "tokenizer.json"))
    assert TransformersTokenizer(str(pretrained_dir)).identity != original.identity


def test_transformers_tokenizer_survives_a_pickle_round_trip(pretrained_dir: Path) -> None:
    tokenizer = TransformersTokenizer(str(pretrained_dir))
    restored = pickle.loads(pickle.dumps(tokenizer))
    assert restored.identity == tokenizer.identity
    assert restored.pad_id == tokenizer.pad_id
    for text in TEXTS:
        assert restored.encode(text) == tokenizer.encode(text)


def test_transformers_tokenizer_is_constructible_from_yaml_class_path(pretrained_dir: Path) -> None:
    parser = ArgumentParser()
    parser.add_argument("--tokenizer", type=Tokenizer)
    config = parser.parse_object(
        {
            "tokenizer": {
                "class_path": "lightning_tune_data.tokenizers.TransformersTokenizer",
                "init_args": {"path": str(pretrained_dir)},
            }
        }
    )
    tokenizer = parser.instantiate(config).tokenizer
    assert isinstance(tokenizer, TransformersTokenizer)
    assert tokenizer.decode(tokenizer.encode("hello world")) == "hello world"


def test_transformers_tokenizer_identity_hashes_the_tokenizer_files_in_name_order(pretrained_dir: Path) -> None:
    # The identity keys caches: it must stay exactly this, or every cache would be rebuilt.
    tokenizer = TransformersTokenizer(str(pretrained_dir))
    digest = hashlib.sha256()
    for path in sorted(p for p in pretrained_dir.iterdir() if p.name in TOKENIZER_FILE_NAMES):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    assert tokenizer.identity == (
        f"TransformersTokenizer:sha256={digest.hexdigest()}:bos={tokenizer.bos_id}:eos={tokenizer.eos_id}"
        f":pad={tokenizer.pad_id}"
    )
