"""The tokenizer contract the data pipeline relies on."""

from __future__ import annotations

from collections.abc import Sequence

from lightning_tune_data.tokenizers import ByteTokenizer, Tokenizer


def test_byte_tokenizer_satisfies_the_tokenizer_protocol() -> None:
    assert isinstance(ByteTokenizer(), Tokenizer)


class _WordTokenizer:
    bos_id, eos_id, pad_id = 0, 1, 2
    vocab_size = 10
    identity = "Words:v1"

    def encode(self, text: str) -> list[int]:
        return [3 + len(word) % 7 for word in text.split()]

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join("w" for _ in ids)


def test_any_object_with_the_contract_is_a_tokenizer_and_one_without_identity_is_not() -> None:
    assert isinstance(_WordTokenizer(), Tokenizer)

    class NoIdentity:
        bos_id, eos_id, pad_id, vocab_size = 0, 1, 2, 3

        def encode(self, text: str) -> list[int]:
            return []

        def decode(self, ids: Sequence[int]) -> str:
            return ""

    assert not isinstance(NoIdentity(), Tokenizer)


def test_built_in_tokenizers_are_found_by_their_short_class_name() -> None:
    # The CLI resolves `--data.tokenizer.help TokenizerFileTokenizer` (and `class_path:
    # TokenizerFileTokenizer`) from the subclasses of the tokenizer type.
    from jsonargparse._typehints import resolve_class_path_by_name

    from lightning_tune_data.tokenizers import ByteTokenizer, Tokenizer, TokenizerFileTokenizer, TransformersTokenizer

    for cls in (ByteTokenizer, TokenizerFileTokenizer, TransformersTokenizer):
        assert Tokenizer in cls.__mro__
        assert resolve_class_path_by_name(Tokenizer, cls.__name__) == f"lightning_tune_data.{cls.__name__}"
