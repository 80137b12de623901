"""``TransformersTokenizer``: a ``transformers`` tokenizer read from a local ``save_pretrained`` folder."""

from __future__ import annotations

import os
from collections.abc import Sequence

from lightning_tune_data.tokenizers.base import Tokenizer
from lightning_tune_data.tokenizers.files import TOKENIZER_FILE_NAMES, import_optional, sha256_files
from lightning_tune_data.tokenizers.special_tokens import resolve_special_ids

__all__ = ["TransformersTokenizer"]


class TransformersTokenizer(Tokenizer):
    """A ``transformers`` tokenizer loaded from a local ``save_pretrained`` directory.

    Loaded with ``AutoTokenizer.from_pretrained(path, local_files_only=True)``: nothing is
    downloaded, so runs are reproducible offline. ``encode`` never adds special tokens;
    ``decode`` drops them, like :class:`~lightning_tune_data.tokenizers.ByteTokenizer`.

    Special tokens are resolved from the given strings, else from the tokenizer's own
    ``bos_token``/``eos_token``/``pad_token``, else from common defaults
    (:data:`~lightning_tune_data.tokenizers.special_tokens.DEFAULT_BOS_TOKENS`, ...). BOS and EOS
    are required. If no pad token exists (common for decoder-only models), ``pad_id`` falls back
    to ``eos_id``; this is safe because padding is always excluded from the loss and from
    attention.

    ``identity`` contains the class name, a sha256 over the directory's tokenizer files
    (:data:`~lightning_tune_data.tokenizers.files.TOKENIZER_FILE_NAMES`) and the special ids, so
    changing any of those files invalidates preprocessing caches.

    Args:
        path: local directory written by ``tokenizer.save_pretrained``.
        bos_token: token string to use as BOS; ``None`` uses the tokenizer's own, else tries, in
            order, ``<s>``, ``<|begin_of_text|>``, ``<|startoftext|>``, ``<bos>``, ``[BOS]``,
            ``<|endoftext|>``.
        eos_token: token string to use as EOS; ``None`` uses the tokenizer's own, else tries, in
            order, ``</s>``, ``<|end_of_text|>``, ``<|endoftext|>``, ``<eos>``, ``[EOS]``.
        pad_token: token string to use as padding; ``None`` uses the tokenizer's own, else tries,
            in order, ``<pad>``, ``[PAD]``, ``<|pad|>``, ``<|padding|>``, then uses EOS.

    Raises:
        ImportError: ``transformers`` is not installed.
        FileNotFoundError: ``path`` is not a directory holding tokenizer files.
        ValueError: a given special token is not in the vocabulary, or no BOS/EOS token exists.
    """

    def __init__(
        self,
        path: str,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
    ) -> None:
        transformers = import_optional("transformers", "TransformersTokenizer")
        path = os.fspath(path)
        files = (
            sorted(
                os.path.join(path, name)
                for name in os.listdir(path)
                if name in TOKENIZER_FILE_NAMES and os.path.isfile(os.path.join(path, name))
            )
            if os.path.isdir(path)
            else []
        )
        if not files:
            raise FileNotFoundError(
                f"TransformersTokenizer: path={path!r} is not a directory holding tokenizer "
                f"files (any of {sorted(TOKENIZER_FILE_NAMES)}). Save one with "
                "`AutoTokenizer.from_pretrained(...).save_pretrained(path)` and pass that "
                "directory; for a single tokenizer.json use TokenizerFileTokenizer."
            )
        self.path = path
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.pad_token = pad_token
        self._sha256 = sha256_files(files)
        self._tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        tok = self._tokenizer
        vocab: dict[str, int] = tok.get_vocab()
        self.bos_id, self.eos_id, self.pad_id = resolve_special_ids(
            f"TransformersTokenizer({path!r})", vocab.get, (bos_token, eos_token, pad_token),
            declared=(tok.bos_token, tok.eos_token, tok.pad_token),
        )

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (every id ``encode`` can return is below it)."""
        return len(self._tokenizer)

    @property
    def identity(self) -> str:
        """Cache key: class name, sha256 of the tokenizer files and the special ids."""
        return (
            f"TransformersTokenizer:sha256={self._sha256}:"
            f"bos={self.bos_id}:eos={self.eos_id}:pad={self.pad_id}"
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without any special tokens.

        Args:
            text: The text to tokenize.
        """
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; special tokens (BOS/EOS/pad...) are dropped.

        Args:
            ids: Token ids.
        """
        return str(self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=True))

    def __repr__(self) -> str:
        return (
            f"TransformersTokenizer(path={self.path!r}, bos_id={self.bos_id}, "
            f"eos_id={self.eos_id}, pad_id={self.pad_id})"
        )
