"""The built-in tokenizer: UTF-8 bytes as tokens, needing no files and no network."""

from __future__ import annotations

from collections.abc import Sequence

from lightning_tune_data.tokenizers.base import Tokenizer

__all__ = ["ByteTokenizer"]


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as tokens: ids 0-255 are bytes, then BOS=256, EOS=257, PAD=258.

    Needs no files and no network, so it is the default for quickstarts and tests. ``pad_id`` is
    distinct from every byte id, so padding can never be confused with text.
    """

    bos_id: int = 256
    eos_id: int = 257
    pad_id: int = 258

    @property
    def vocab_size(self) -> int:
        """256 byte ids plus BOS, EOS and PAD."""
        return 259

    @property
    def identity(self) -> str:
        """Cache key; fixed, since the tokenization never changes."""
        return "ByteTokenizer:v1"

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of ``text``, without special tokens.

        Args:
            text: The text to tokenize.
        """
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of the byte ids among ``ids`` (special ids are dropped; invalid UTF-8 is replaced).

        Args:
            ids: Token ids.
        """
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer()"
