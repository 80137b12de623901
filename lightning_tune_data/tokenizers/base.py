"""The tokenizer contract: what the data pipeline needs from a tokenizer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

__all__ = ["Tokenizer"]


@runtime_checkable
class Tokenizer(Protocol):
    """What the data pipeline needs from a tokenizer.

    ``encode`` adds no special tokens (the preprocessing adds BOS/EOS itself), ``decode`` drops
    them; ``identity`` is a string that changes whenever the tokenization could change: it keys
    the preprocessing cache.
    """

    bos_id: int
    eos_id: int
    pad_id: int

    @property
    def vocab_size(self) -> int:
        """Number of ids: every id ``encode`` returns, and every special id, is below it."""

    @property
    def identity(self) -> str:
        """A string that changes whenever the tokenization could change (it keys the cache)."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without special tokens.

        Args:
            text: The text to tokenize.
        """

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; special tokens are dropped.

        Args:
            ids: Token ids.
        """
