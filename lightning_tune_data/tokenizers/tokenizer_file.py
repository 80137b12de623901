"""``TokenizerFileTokenizer``: a ``tokenizers`` library tokenizer read from a ``tokenizer.json``."""

from __future__ import annotations

import os
from collections.abc import Sequence

from lightning_tune_data.tokenizers.base import Tokenizer
from lightning_tune_data.tokenizers.files import import_optional, sha256_files
from lightning_tune_data.tokenizers.special_tokens import resolve_special_ids

__all__ = ["TokenizerFileTokenizer"]


class TokenizerFileTokenizer(Tokenizer):
    """A ``tokenizers`` library tokenizer loaded from a ``tokenizer.json`` file.

    ``encode`` never adds special tokens (the preprocessing step adds BOS/EOS explicitly, so
    the same code works for every tokenizer); ``decode`` drops special tokens, like
    :class:`~lightning_tune_data.tokenizers.ByteTokenizer`.

    Special tokens are resolved from the given strings, else from common defaults
    (:data:`~lightning_tune_data.tokenizers.special_tokens.DEFAULT_BOS_TOKENS`, ...).
    BOS and EOS are required. If no pad token exists, ``pad_id`` falls back to ``eos_id``:
    padding positions are always excluded from the loss (``labels == -100``) and from attention
    (``attention_mask == 0``), so reusing EOS as padding is safe.

    ``identity`` contains the class name, a sha256 of the file's contents and the special ids,
    so editing the file (or choosing other special tokens) invalidates preprocessing caches.

    Args:
        path: path to a ``tokenizer.json`` written by ``tokenizers.Tokenizer.save``.
        bos_token: token string to use as BOS; ``None`` tries, in order, ``<s>``,
            ``<|begin_of_text|>``, ``<|startoftext|>``, ``<bos>``, ``[BOS]``, ``<|endoftext|>``.
        eos_token: token string to use as EOS; ``None`` tries, in order, ``</s>``,
            ``<|end_of_text|>``, ``<|endoftext|>``, ``<eos>``, ``[EOS]``.
        pad_token: token string to use as padding; ``None`` tries, in order, ``<pad>``, ``[PAD]``,
            ``<|pad|>``, ``<|padding|>``, then uses EOS.

    Raises:
        ImportError: ``tokenizers`` is not installed.
        FileNotFoundError: ``path`` is not a file.
        ValueError: a given special token is not in the vocabulary, or no BOS/EOS token exists.
    """

    def __init__(
        self,
        path: str,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
    ) -> None:
        tokenizers = import_optional("tokenizers", "TokenizerFileTokenizer")
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"TokenizerFileTokenizer: path={path!r} is not a file; pass the path of a "
                "tokenizer.json (written by tokenizers.Tokenizer.save). For a transformers "
                "save_pretrained directory use TransformersTokenizer instead."
            )
        self.path = path
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.pad_token = pad_token
        self._sha256 = sha256_files([path])
        self._tokenizer = tokenizers.Tokenizer.from_file(path)
        self.bos_id, self.eos_id, self.pad_id = resolve_special_ids(
            f"TokenizerFileTokenizer({path!r})", self._tokenizer.token_to_id, (bos_token, eos_token, pad_token)
        )

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (every id ``encode`` can return is below it)."""
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    @property
    def identity(self) -> str:
        """Cache key: class name, sha256 of ``tokenizer.json`` and the special ids."""
        return (
            f"TokenizerFileTokenizer:sha256={self._sha256}:"
            f"bos={self.bos_id}:eos={self.eos_id}:pad={self.pad_id}"
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without any special tokens.

        Args:
            text: The text to tokenize.
        """
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of every text (no special tokens), encoded by the library's parallel batch encoder.

        Uses ``encode_batch_fast`` where the installed ``tokenizers`` has it: the same ids,
        without computing character offsets, which the pipeline never reads.

        Args:
            texts: The texts to tokenize.
        """
        encode = getattr(self._tokenizer, "encode_batch_fast", None) or self._tokenizer.encode_batch
        return [encoding.ids for encoding in encode(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; special tokens (BOS/EOS/pad...) are dropped.

        Args:
            ids: Token ids.
        """
        return str(self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=True))

    def __repr__(self) -> str:
        return (
            f"TokenizerFileTokenizer(path={self.path!r}, bos_id={self.bos_id}, "
            f"eos_id={self.eos_id}, pad_id={self.pad_id})"
        )
