"""Tiny real ``tokenizers`` BPE models, trained on a few sentences (fast, offline), saved as a
``tokenizer.json`` and as a ``transformers`` ``save_pretrained`` directory: exactly what a user's
tokenizer files look like. Test modules import the fixtures they use."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer as RawTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

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
