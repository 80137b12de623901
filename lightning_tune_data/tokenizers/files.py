"""What tokenizer adapters share: the content hash of tokenizer files (part of a tokenizer's
identity, so editing a file invalidates preprocessing caches) and importing the optional
libraries that read those files."""

from __future__ import annotations

import hashlib
import importlib
import os
from collections.abc import Sequence
from types import ModuleType

__all__ = ["INSTALL_HINT", "TOKENIZER_FILE_NAMES", "import_optional", "sha256_files"]

#: How to install the optional tokenizer libraries.
INSTALL_HINT = "pip install 'lightning-tune-data[tokenizers]'"

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


def sha256_files(paths: Sequence[str]) -> str:
    """Hash the names and contents of ``paths`` (in the given order) into one hex digest.

    Args:
        paths: The files, in the order they are hashed.
    """
    digest = hashlib.sha256()
    for path in paths:
        digest.update(os.path.basename(path).encode("utf-8") + b"\0")
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest()


def import_optional(module: str, owner: str) -> ModuleType:
    """Import the optional library ``module`` that ``owner`` (a class name) needs.

    Args:
        module: The library's module name.
        owner: The class that needs it (named in the error).

    Raises:
        ImportError: The library is not installed; the message says how to install it.
    """
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"{owner} needs the optional '{module}' package: {INSTALL_HINT}") from error
