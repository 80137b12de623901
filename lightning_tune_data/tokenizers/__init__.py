"""Tokenizers: a built-in UTF-8 byte tokenizer and adapters for local tokenizer files.

Every tokenizer exposes the small contract the rest of the package relies on
(:class:`Tokenizer`): ``encode(str) -> list[int]`` (no special tokens added),
``decode(list[int]) -> str``, ``bos_id``, ``eos_id``, ``pad_id``, ``vocab_size`` and ``identity``
(a string that changes whenever the tokenization could change; it keys the preprocessing cache).

* :class:`ByteTokenizer`: UTF-8 bytes, no files needed;
* :class:`TokenizerFileTokenizer`: a ``tokenizer.json`` of the ``tokenizers`` library;
* :class:`TransformersTokenizer`: a local ``transformers`` ``save_pretrained`` directory.
"""

from lightning_tune_data.tokenizers.base import Tokenizer
from lightning_tune_data.tokenizers.byte import ByteTokenizer
from lightning_tune_data.tokenizers.files import TOKENIZER_FILE_NAMES
from lightning_tune_data.tokenizers.special_tokens import DEFAULT_BOS_TOKENS, DEFAULT_EOS_TOKENS, DEFAULT_PAD_TOKENS
from lightning_tune_data.tokenizers.tokenizer_file import TokenizerFileTokenizer
from lightning_tune_data.tokenizers.transformers_tokenizer import TransformersTokenizer

__all__ = [
    "DEFAULT_BOS_TOKENS",
    "DEFAULT_EOS_TOKENS",
    "DEFAULT_PAD_TOKENS",
    "TOKENIZER_FILE_NAMES",
    "ByteTokenizer",
    "Tokenizer",
    "TokenizerFileTokenizer",
    "TransformersTokenizer",
]
