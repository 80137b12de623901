"""Special-token resolution: explicit tokens must exist, else the declared one, else common spellings."""

from __future__ import annotations

import pytest

from lightning_tune_data.tokenizers.special_tokens import (
    DEFAULT_BOS_TOKENS,
    DEFAULT_EOS_TOKENS,
    DEFAULT_PAD_TOKENS,
    resolve_special_id,
    resolve_special_ids,
)

VOCAB = {"<s>": 0, "</s>": 1, "<pad>": 2, "<|endoftext|>": 3, "<bos>": 4, "[X]": 5}


def test_an_explicit_token_wins_and_must_exist() -> None:
    assert resolve_special_id(role="bos", explicit="[X]", declared="<s>", defaults=DEFAULT_BOS_TOKENS,
                              lookup=VOCAB.get, owner="T('p')") == 5
    with pytest.raises(ValueError, match=r"T\('p'\): bos_token='\[Y\]' is not in the tokenizer's vocabulary"):
        resolve_special_id(role="bos", explicit="[Y]", declared=None, defaults=DEFAULT_BOS_TOKENS,
                           lookup=VOCAB.get, owner="T('p')")


def test_the_declared_token_comes_before_the_defaults_which_are_tried_in_order() -> None:
    assert resolve_special_id(role="bos", explicit=None, declared="<bos>", defaults=DEFAULT_BOS_TOKENS,
                              lookup=VOCAB.get, owner="T") == 4
    assert resolve_special_id(role="bos", explicit=None, declared="<missing>", defaults=DEFAULT_BOS_TOKENS,
                              lookup=VOCAB.get, owner="T") == 0
    assert resolve_special_id(role="pad", explicit=None, declared=None, defaults=("[PAD]",),
                              lookup=VOCAB.get, owner="T") is None


def test_gpt2_style_vocabularies_use_one_token_as_bos_and_eos() -> None:
    vocab = {"<|endoftext|>": 7}
    assert resolve_special_ids("T", vocab.get, (None, None, None)) == (7, 7, 7)  # pad falls back to EOS
    assert "<|endoftext|>" in DEFAULT_BOS_TOKENS and "<|endoftext|>" in DEFAULT_EOS_TOKENS
    assert "<pad>" in DEFAULT_PAD_TOKENS


def test_resolve_special_ids_checks_bos_then_eos_and_names_the_missing_role() -> None:
    assert resolve_special_ids("T", VOCAB.get, (None, None, None)) == (0, 1, 2)
    assert resolve_special_ids("T", VOCAB.get, (None, None, None), declared=("<bos>", None, "[X]")) == (4, 1, 5)
    with pytest.raises(ValueError, match=r"T: no BOS token found in the vocabulary \(tried \['<s>'"):
        resolve_special_ids("T", {"</s>": 1}.get, (None, "<missing>", None))  # BOS is checked first
    with pytest.raises(ValueError, match=r"no EOS token found.*eos_token='<your eos token>'"):
        resolve_special_ids("T", {"<s>": 0}.get, (None, None, None))
