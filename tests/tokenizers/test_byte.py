"""ByteTokenizer: UTF-8 bytes as tokens, BOS/EOS/PAD above the byte range."""

from __future__ import annotations

import pickle

import pytest

from lightning_tune_data.tokenizers import ByteTokenizer


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


def test_byte_tokenizer_identity_and_ids_never_change() -> None:
    # The identity keys every cache built with this tokenizer: a change would rebuild them all.
    tokenizer = ByteTokenizer()
    assert tokenizer.identity == "ByteTokenizer:v1"
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id, tokenizer.vocab_size) == (256, 257, 258, 259)
    assert repr(tokenizer) == "ByteTokenizer()"


def test_byte_tokenizer_decode_replaces_invalid_utf8_and_survives_pickling() -> None:
    tokenizer = pickle.loads(pickle.dumps(ByteTokenizer()))
    assert tokenizer.decode([0xC3]) == "\ufffd"  # a cut multi-byte character
    assert tokenizer.decode(tokenizer.encode("héllo")) == "héllo"
