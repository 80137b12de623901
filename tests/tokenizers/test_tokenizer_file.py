"""TokenizerFileTokenizer: a ``tokenizers`` library ``tokenizer.json``, loaded through the adapter."""

from __future__ import annotations

import hashlib
import pickle
import shutil
from pathlib import Path

import pytest
from bpe_tokenizers import TEXTS, pretrained_dir, raw_tokenizer, tokenizer_json, train_bpe  # noqa: F401 - fixtures
from jsonargparse import ArgumentParser
from tokenizers import Tokenizer as RawTokenizer

from lightning_tune_data.tokenizers import Tokenizer, TokenizerFileTokenizer


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_file_round_trips_text_including_non_ascii(tokenizer_json: Path, text: str) -> None:
    tokenizer = TokenizerFileTokenizer(str(tokenizer_json))
    ids = tokenizer.encode(text)
    assert all(isinstance(i, int) and 0 <= i < tokenizer.vocab_size for i in ids)
    assert tokenizer.decode(ids) == text


def test_tokenizer_file_encode_batch_matches_encode_per_text(tokenizer_json: Path) -> None:
    tokenizer = TokenizerFileTokenizer(str(tokenizer_json))
    assert tokenizer.encode_batch(TEXTS) == [tokenizer.encode(text) for text in TEXTS]
    assert tokenizer.encode_batch([]) == []


def test_tokenizer_file_encode_batch_gives_the_library_batch_encoder_ids_without_the_template(
    tokenizer_json: Path, raw_tokenizer: RawTokenizer
) -> None:
    tokenizer = TokenizerFileTokenizer(str(tokenizer_json))
    library = [encoding.ids for encoding in raw_tokenizer.encode_batch(TEXTS, add_special_tokens=False)]
    templated = [encoding.ids for encoding in raw_tokenizer.encode_batch(TEXTS)]

    assert tokenizer.encode_batch(TEXTS) == library
    assert tokenizer.encode_batch(tuple(TEXTS)) == library  # any sequence of texts
    assert library != templated  # the template would have added <s> ... </s>


def test_tokenize_text_with_a_batch_encoder_names_a_none_row(tokenizer_json: Path) -> None:
    from lightning_tune_data.preprocess import RowError, tokenize_text

    tokenizer = TokenizerFileTokenizer(str(tokenizer_json))
    with pytest.raises(RowError) as info:
        tokenize_text({"text": ["hello", "world", None]}, tokenizer)
    assert (info.value.column, info.value.row) == ("text", 2)


def test_tokenize_text_with_a_batch_encoder_equals_the_per_text_path(tokenizer_json: Path) -> None:
    from lightning_tune_data.preprocess import tokenize_text

    tokenizer = TokenizerFileTokenizer(str(tokenizer_json))
    batch = tokenize_text({"text": list(TEXTS)}, tokenizer)
    expected = [[tokenizer.bos_id, *tokenizer.encode(text), tokenizer.eos_id] for text in TEXTS]
    assert batch == {"input_ids": expected}
    with pytest.raises(ValueError, match="None"):
        tokenize_text({"text": ["fine", None]}, tokenizer)


def test_tokenizer_file_encode_adds_no_special_tokens_even_with_a_template(
    tokenizer_json: Path, raw_tokenizer: RawTokenizer
) -> None:
    tokenizer = TokenizerFileTokenizer(str(tokenizer_json))
    text = "hello world"
    with_specials = raw_tokenizer.encode(text).ids
    assert with_specials[0] == tokenizer.bos_id and with_specials[-1] == tokenizer.eos_id
    assert tokenizer.encode(text) == with_specials[1:-1]


def test_tokenizer_file_resolves_default_special_tokens(
    tokenizer_json: Path, raw_tokenizer: RawTokenizer
) -> None:
    tokenizer = TokenizerFileTokenizer(str(tokenizer_json))
    assert tokenizer.bos_id == raw_tokenizer.token_to_id("<s>")
    assert tokenizer.eos_id == raw_tokenizer.token_to_id("</s>")
    assert tokenizer.pad_id == raw_tokenizer.token_to_id("<pad>")
    assert tokenizer.vocab_size == raw_tokenizer.get_vocab_size(with_added_tokens=True)
    assert isinstance(tokenizer, Tokenizer)


def test_tokenizer_file_uses_explicitly_named_special_tokens(tmp_path: Path) -> None:
    raw = train_bpe(["<s>", "</s>", "<|doc|>", "<|end|>", "<|fill|>"], add_template=False)
    path = tmp_path / "tokenizer.json"
    raw.save(str(path))
    tokenizer = TokenizerFileTokenizer(
        str(path), bos_token="<|doc|>", eos_token="<|end|>", pad_token="<|fill|>"
    )
    assert tokenizer.bos_id == raw.token_to_id("<|doc|>")
    assert tokenizer.eos_id == raw.token_to_id("<|end|>")
    assert tokenizer.pad_id == raw.token_to_id("<|fill|>")


def test_tokenizer_file_without_pad_token_pads_with_eos(tmp_path: Path) -> None:
    raw = train_bpe(["<s>", "</s>"], add_template=False)
    path = tmp_path / "tokenizer.json"
    raw.save(str(path))
    tokenizer = TokenizerFileTokenizer(str(path))
    assert tokenizer.pad_id == tokenizer.eos_id == raw.token_to_id("</s>")


def test_tokenizer_file_without_bos_token_raises_naming_the_token_and_the_fix(tmp_path: Path) -> None:
    raw = train_bpe(["</s>"], add_template=False)
    path = tmp_path / "tokenizer.json"
    raw.save(str(path))
    with pytest.raises(ValueError, match="no BOS token") as info:
        TokenizerFileTokenizer(str(path))
    message = str(info.value)
    assert "bos_token=" in message and "init_args" in message and "'<s>'" in message


def test_tokenizer_file_with_unknown_explicit_token_raises_naming_it(tokenizer_json: Path) -> None:
    with pytest.raises(ValueError, match=r"eos_token='<\|nope\|>' is not in the tokenizer's vocabulary"):
        TokenizerFileTokenizer(str(tokenizer_json), eos_token="<|nope|>")


def test_tokenizer_file_missing_path_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        TokenizerFileTokenizer(str(tmp_path / "missing.json"))


def test_tokenizer_file_identity_follows_file_contents_not_path(
    tmp_path: Path, tokenizer_json: Path
) -> None:
    original = TokenizerFileTokenizer(str(tokenizer_json))
    assert original.identity.startswith("TokenizerFileTokenizer:")

    copy_path = tmp_path / "copy" / "tokenizer.json"
    copy_path.parent.mkdir()
    shutil.copy(tokenizer_json, copy_path)
    assert TokenizerFileTokenizer(str(copy_path)).identity == original.identity

    edited = RawTokenizer.from_file(str(copy_path))
    edited.add_tokens(["<|new_token|>"])
    edited.save(str(copy_path))
    assert TokenizerFileTokenizer(str(copy_path)).identity != original.identity


def test_tokenizer_file_identity_changes_with_the_chosen_special_tokens(tokenizer_json: Path) -> None:
    default = TokenizerFileTokenizer(str(tokenizer_json))
    other_pad = TokenizerFileTokenizer(str(tokenizer_json), pad_token="</s>")
    assert default.identity != other_pad.identity


def test_tokenizer_file_survives_a_pickle_round_trip(tokenizer_json: Path) -> None:
    tokenizer = TokenizerFileTokenizer(str(tokenizer_json))
    restored = pickle.loads(pickle.dumps(tokenizer))
    assert restored.identity == tokenizer.identity
    assert (restored.bos_id, restored.eos_id, restored.pad_id) == (
        tokenizer.bos_id,
        tokenizer.eos_id,
        tokenizer.pad_id,
    )
    for text in TEXTS:
        assert restored.encode(text) == tokenizer.encode(text)


def test_tokenizer_file_is_constructible_from_yaml_class_path(tokenizer_json: Path) -> None:
    parser = ArgumentParser()
    parser.add_argument("--tokenizer", type=Tokenizer)
    config = parser.parse_string(
        "tokenizer:\n"
        "  class_path: lightning_tune_data.tokenizers.TokenizerFileTokenizer\n"
        "  init_args:\n"
        f"    path: {tokenizer_json}\n"
        "    pad_token: </s>\n"
    )
    tokenizer = parser.instantiate(config).tokenizer
    assert isinstance(tokenizer, TokenizerFileTokenizer)
    assert tokenizer.pad_id == tokenizer.eos_id


def test_tokenizer_file_identity_is_the_sha256_of_the_file_name_and_bytes_with_the_special_ids(
    tokenizer_json: Path,
) -> None:
    # The identity keys caches: it must stay exactly this, or every cache would be rebuilt.
    tokenizer = TokenizerFileTokenizer(str(tokenizer_json))
    digest = hashlib.sha256(b"tokenizer.json\0" + tokenizer_json.read_bytes() + b"\0").hexdigest()
    assert tokenizer.identity == (
        f"TokenizerFileTokenizer:sha256={digest}:bos={tokenizer.bos_id}:eos={tokenizer.eos_id}:pad={tokenizer.pad_id}"
    )
    assert repr(tokenizer) == (
        f"TokenizerFileTokenizer(path={str(tokenizer_json)!r}, bos_id={tokenizer.bos_id}, "
        f"eos_id={tokenizer.eos_id}, pad_id={tokenizer.pad_id})"
    )
