"""Tokenizers: a built-in UTF-8 byte tokenizer and adapters for local tokenizer files.

Every tokenizer exposes the small contract the rest of the package relies on:
``encode(str) -> list[int]`` (no special tokens added), ``decode(list[int]) -> str``,
``bos_id``, ``eos_id``, ``pad_id``, ``vocab_size`` and ``identity`` (a string that changes
whenever the tokenization could change; it keys the preprocessing cache).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Tokenizer(Protocol):
    """What the data pipeline needs from a tokenizer."""

    bos_id: int
    eos_id: int
    pad_id: int

    @property
    def vocab_size(self) -> int: ...

    @property
    def identity(self) -> str: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: ids 0-255 are bytes, then BOS=256, EOS=257, PAD=258.

    Needs no files and no network, so it is the default for quickstarts and tests. ``pad_id`` is
    distinct from every byte id, so padding can never be confused with text.
    """

    bos_id: int = 256
    eos_id: int = 257
    pad_id: int = 258

    @property
    def vocab_size(self) -> int:
        return 259

    @property
    def identity(self) -> str:
        return "ByteTokenizer:v1"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return "ByteTokenizer()"


# --------------------------------------------------------------------------------------------
# Adapters for local tokenizer files (optional dependencies: ``tokenizers`` / ``transformers``)
# --------------------------------------------------------------------------------------------

_INSTALL_HINT = "pip install 'lightning-tune-data[tokenizers]'"

#: Token strings tried, in order, when no explicit special token is given (and, for
#: ``TransformersTokenizer``, the tokenizer declares no ``bos_token``/``eos_token``/``pad_token``).
DEFAULT_BOS_TOKENS: tuple[str, ...] = (
    "<s>",
    "<|begin_of_text|>",
    "<|startoftext|>",
    "<bos>",
    "[BOS]",
    "<|endoftext|>",  # GPT-2 style: one token serves as BOS and EOS
)
DEFAULT_EOS_TOKENS: tuple[str, ...] = (
    "</s>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<eos>",
    "[EOS]",
)
DEFAULT_PAD_TOKENS: tuple[str, ...] = ("<pad>", "[PAD]", "<|pad|>", "<|padding|>")

#: Files of a ``save_pretrained`` directory that determine tokenization (hashed into ``identity``).
#: Model weights and configs are deliberately not hashed: they can be gigabytes and never change
#: the tokens.
TOKENIZER_FILE_NAMES: frozenset[str] = frozenset(
    {
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "vocab.json",
        "vocab.txt",
        "merges.txt",
        "tokenizer.model",
        "spiece.model",
        "sentencepiece.bpe.model",
    }
)


def _sha256_files(paths: Sequence[str]) -> str:
    """Hash the names and contents of ``paths`` (in the given order) into one hex digest."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(os.path.basename(path).encode("utf-8") + b"\0")
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()


def _resolve_special_id(
    *,
    role: str,
    explicit: str | None,
    declared: str | None,
    defaults: Sequence[str],
    lookup: Callable[[str], int | None],
    owner: str,
) -> int | None:
    """Find the id of the ``role`` special token (``"bos"``, ``"eos"`` or ``"pad"``).

    Args:
        role: which special token this is; used in error messages and the argument name.
        explicit: token string the user passed (``bos_token=...``); it must exist or this raises.
        declared: token string the tokenizer itself declares (transformers' ``bos_token``), if any.
        defaults: common token strings tried in order when neither of the above is given.
        lookup: maps a token string to its id, or ``None`` when the vocabulary lacks it.
        owner: ``ClassName('path')`` for error messages.

    Returns:
        The id, or ``None`` when nothing was given and no default exists in the vocabulary.

    Raises:
        ValueError: an explicitly given token string is not in the vocabulary.
    """
    if explicit is not None:
        token_id = lookup(explicit)
        if token_id is None:
            raise ValueError(
                f"{owner}: {role}_token={explicit!r} is not in the tokenizer's vocabulary. "
                f"Pass a token string that exists, e.g. {role}_token='<token>' in Python or "
                f"`init_args: {{{role}_token: '<token>'}}` in YAML."
            )
        return token_id
    for candidate in ([declared] if declared else []) + list(defaults):
        token_id = lookup(candidate)
        if token_id is not None:
            return token_id
    return None


def _missing_special_error(role: str, tried: Sequence[str], owner: str) -> ValueError:
    """The error for a required special token (BOS/EOS) that could not be found."""
    return ValueError(
        f"{owner}: no {role.upper()} token found in the vocabulary (tried {list(tried)}). "
        f"Name the token that plays this role: {role}_token='<your {role} token>' in Python, or "
        f"`init_args: {{{role}_token: '<your {role} token>'}}` under the tokenizer in YAML."
    )


def _import_tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"TokenizerFileTokenizer needs the optional 'tokenizers' package: {_INSTALL_HINT}"
        ) from error
    return tokenizers


def _import_transformers() -> Any:
    try:
        import transformers
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"TransformersTokenizer needs the optional 'transformers' package: {_INSTALL_HINT}"
        ) from error
    return transformers


class TokenizerFileTokenizer:
    """A ``tokenizers`` library tokenizer loaded from a ``tokenizer.json`` file.

    ``encode`` never adds special tokens (the preprocessing step adds BOS/EOS explicitly, so
    the same code works for every tokenizer); ``decode`` drops special tokens, like
    :class:`ByteTokenizer`.

    Special tokens are resolved from the given strings, else from common defaults
    (:data:`DEFAULT_BOS_TOKENS`, :data:`DEFAULT_EOS_TOKENS`, :data:`DEFAULT_PAD_TOKENS`).
    BOS and EOS are required. If no pad token exists, ``pad_id`` falls back to ``eos_id``:
    padding positions are always excluded from the loss (``labels == -100``) and from attention
    (``attention_mask == 0``), so reusing EOS as padding is safe.

    ``identity`` contains the class name, a sha256 of the file's contents and the special ids,
    so editing the file (or choosing other special tokens) invalidates preprocessing caches.

    Args:
        path: path to a ``tokenizer.json`` written by ``tokenizers.Tokenizer.save``.
        bos_token: token string to use as BOS; ``None`` tries the defaults.
        eos_token: token string to use as EOS; ``None`` tries the defaults.
        pad_token: token string to use as padding; ``None`` tries the defaults, then uses EOS.

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
        tokenizers = _import_tokenizers()
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
        self._sha256 = _sha256_files([path])
        self._tokenizer = tokenizers.Tokenizer.from_file(path)
        owner = f"TokenizerFileTokenizer({path!r})"
        lookup = self._tokenizer.token_to_id
        bos_id = _resolve_special_id(
            role="bos", explicit=bos_token, declared=None, defaults=DEFAULT_BOS_TOKENS,
            lookup=lookup, owner=owner,
        )
        if bos_id is None:
            raise _missing_special_error("bos", DEFAULT_BOS_TOKENS, owner)
        eos_id = _resolve_special_id(
            role="eos", explicit=eos_token, declared=None, defaults=DEFAULT_EOS_TOKENS,
            lookup=lookup, owner=owner,
        )
        if eos_id is None:
            raise _missing_special_error("eos", DEFAULT_EOS_TOKENS, owner)
        pad_id = _resolve_special_id(
            role="pad", explicit=pad_token, declared=None, defaults=DEFAULT_PAD_TOKENS,
            lookup=lookup, owner=owner,
        )
        self.bos_id: int = int(bos_id)
        self.eos_id: int = int(eos_id)
        self.pad_id: int = int(eos_id if pad_id is None else pad_id)

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
        """Token ids of ``text`` without any special tokens."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of every text (no special tokens), encoded by the library's parallel batch encoder.

        Uses ``encode_batch_fast`` where the installed ``tokenizers`` has it: the same ids,
        without computing character offsets, which the pipeline never reads.
        """
        encode = getattr(self._tokenizer, "encode_batch_fast", None) or self._tokenizer.encode_batch
        return [encoding.ids for encoding in encode(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; special tokens (BOS/EOS/pad...) are dropped."""
        return str(self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=True))

    def __repr__(self) -> str:
        return (
            f"TokenizerFileTokenizer(path={self.path!r}, bos_id={self.bos_id}, "
            f"eos_id={self.eos_id}, pad_id={self.pad_id})"
        )


class TransformersTokenizer:
    """A ``transformers`` tokenizer loaded from a local ``save_pretrained`` directory.

    Loaded with ``AutoTokenizer.from_pretrained(path, local_files_only=True)``: nothing is
    downloaded, so runs are reproducible offline. ``encode`` never adds special tokens;
    ``decode`` drops them, like :class:`ByteTokenizer`.

    Special tokens are resolved from the given strings, else from the tokenizer's own
    ``bos_token``/``eos_token``/``pad_token``, else from common defaults
    (:data:`DEFAULT_BOS_TOKENS`, ...). BOS and EOS are required. If no pad token exists (common
    for decoder-only models), ``pad_id`` falls back to ``eos_id``; this is safe because padding
    is always excluded from the loss and from attention.

    ``identity`` contains the class name, a sha256 over the directory's tokenizer files
    (:data:`TOKENIZER_FILE_NAMES`) and the special ids, so changing any of those files
    invalidates preprocessing caches.

    Args:
        path: local directory written by ``tokenizer.save_pretrained``.
        bos_token: token string to use as BOS; ``None`` uses the tokenizer's own, then defaults.
        eos_token: token string to use as EOS; ``None`` uses the tokenizer's own, then defaults.
        pad_token: token string to use as padding; ``None`` uses the tokenizer's own, then
            defaults, then EOS.

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
        transformers = _import_transformers()
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
        self._sha256 = _sha256_files(files)
        self._tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
        owner = f"TransformersTokenizer({path!r})"
        vocab: dict[str, int] = self._tokenizer.get_vocab()
        lookup = vocab.get
        tok = self._tokenizer
        bos_id = _resolve_special_id(
            role="bos", explicit=bos_token, declared=tok.bos_token,
            defaults=DEFAULT_BOS_TOKENS, lookup=lookup, owner=owner,
        )
        if bos_id is None:
            raise _missing_special_error("bos", DEFAULT_BOS_TOKENS, owner)
        eos_id = _resolve_special_id(
            role="eos", explicit=eos_token, declared=tok.eos_token,
            defaults=DEFAULT_EOS_TOKENS, lookup=lookup, owner=owner,
        )
        if eos_id is None:
            raise _missing_special_error("eos", DEFAULT_EOS_TOKENS, owner)
        pad_id = _resolve_special_id(
            role="pad", explicit=pad_token, declared=tok.pad_token,
            defaults=DEFAULT_PAD_TOKENS, lookup=lookup, owner=owner,
        )
        self.bos_id: int = int(bos_id)
        self.eos_id: int = int(eos_id)
        self.pad_id: int = int(eos_id if pad_id is None else pad_id)

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
        """Token ids of ``text`` without any special tokens."""
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; special tokens (BOS/EOS/pad...) are dropped."""
        return str(self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=True))

    def __repr__(self) -> str:
        return (
            f"TransformersTokenizer(path={self.path!r}, bos_id={self.bos_id}, "
            f"eos_id={self.eos_id}, pad_id={self.pad_id})"
        )
