"""Tokenizers: the built-in ByteTokenizer and the adapters for local tokenizer files.

The adapter tests train tiny real ``tokenizers`` BPE models on a few sentences (fast, offline)
and load them back through the adapters, exactly as a user's ``tokenizer.json`` or
``save_pretrained`` directory would be loaded.
"""

from __future__ import annotations

import pickle
import shutil
from pathlib import Path

import pytest
from jsonargparse import ArgumentParser
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from lightning_tune_data.tokenizers import (
    ByteTokenizer,
    TokenizerFileTokenizer,
    Tokenizer,
    TransformersTokenizer,
)

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "hello world, hello tokenizer",
    "héllo wörld: ünïcode, 日本語 and emoji 🙂",
    "language models predict the next token",
]
TEXTS = ["hello world", "héllo wörld 日本語 🙂", "a never-seen word: zyxwvut!", ""]


def train_bpe(special_tokens: list[str], add_template: bool = True) -> RawTokenizer:
    """A byte-level BPE (exact round trips) trained on CORPUS.

    With ``add_template`` the tokenizer's post-processor wraps every encoding in ``<s> ... </s>``,
    so an adapter that forgot ``add_special_tokens=False`` would be caught.
    """
    tokenizer = RawTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    if add_template:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>",
            special_tokens=[("<s>", tokenizer.token_to_id("<s>")), ("</s>", tokenizer.token_to_id("</s>"))],
        )
    return tokenizer


@pytest.fixture(scope="module")
def raw_tokenizer() -> RawTokenizer:
    return train_bpe(["<s>", "</s>", "<pad>"])


@pytest.fixture()
def tokenizer_json(tmp_path: Path, raw_tokenizer: RawTokenizer) -> Path:
    path = tmp_path / "tokenizer.json"
    raw_tokenizer.save(str(path))
    return path


@pytest.fixture()
def pretrained_dir(tmp_path: Path, raw_tokenizer: RawTokenizer) -> Path:
    directory = tmp_path / "hf_tokenizer"
    fast = PreTrainedTokenizerFast(
        tokenizer_object=raw_tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(str(directory))
    return directory


# ----------------------------------------------------------------------------- ByteTokenizer


@pytest.mark.parametrize("text", ["plain ascii", "héllo wörld", "日本語 🙂 mixed", ""])
def test_byte_tokenizer_round_trips_ascii_and_non_ascii_text(text: str) -> None:
    tokenizer = ByteTokenizer()
    ids = tokenizer.encode(text)
    assert ids == list(text.encode("utf-8"))
    assert tokenizer.decode(ids) == text


def test_byte_tokenizer_pad_is_distinct_from_every_byte_and_special_id() -> None:
    tokenizer = ByteTokenizer()
    all_bytes = set(tokenizer.encode(bytes(range(256)).decode("latin-1")))
    assert all(0 <= i < 256 for i in all_bytes)
    assert tokenizer.pad_id not in set(range(256))
    assert len({tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id}) == 3
    assert max(tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id) < tokenizer.vocab_size


def test_byte_tokenizer_decode_drops_special_ids() -> None:
    tokenizer = ByteTokenizer()
    ids = [tokenizer.bos_id, *tokenizer.encode("hi"), tokenizer.eos_id, tokenizer.pad_id]
    assert tokenizer.decode(ids) == "hi"


def test_byte_tokenizer_satisfies_the_tokenizer_protocol() -> None:
    assert isinstance(ByteTokenizer(), Tokenizer)


# -------------------------------------------------------------------- TokenizerFileTokenizer


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


# --------------------------------------------------------------------- TransformersTokenizer


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
