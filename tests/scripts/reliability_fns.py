"""Functions the reliability tests refer to by dotted path (``reliability_fns.<name>``).

The tests and the scripts next to this file put ``tests/scripts`` on ``sys.path``, so the same
module (hence the same cache fingerprint) is imported by the test process, by subprocesses,
by DDP ranks and by dataloader workers.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from lightning_tune_data.models import TinyCausalLM
from lightning_tune_data.preprocess import tokenize_text
from lightning_tune_data.tokenizers import ByteTokenizer

_TOKENIZER = ByteTokenizer()


def text_of(sample: dict[str, Any]) -> str:
    """Decode a document sample's ``input_ids`` back to text (BOS/EOS dropped)."""
    return _TOKENIZER.decode([int(i) for i in sample["input_ids"]])


def keep_marked(sample: dict[str, Any]) -> bool:
    """Filter: keep documents whose text starts with ``KEEP``."""
    return text_of(sample).startswith("KEEP")


def drop_everything(sample: dict[str, Any]) -> bool:
    """Filter that drops every document."""
    return False


def raise_on_boom(sample: dict[str, Any]) -> dict[str, Any]:
    """Model transform that fails on documents containing ``BOOM``."""
    if "BOOM" in text_of(sample):
        raise ValueError("raise_on_boom: this document is broken")
    return sample


def tokenize_nothing(examples: dict[str, list], tokenizer: Any) -> dict[str, list]:
    """A preprocess function that filters every row out (an empty dataset after filtering)."""
    return {"input_ids": []}


def slow_tokenize(examples: dict[str, list], tokenizer: Any, text_column: str = "text") -> dict[str, list]:
    """``tokenize_text`` that, when ``RELIABILITY_LOG`` is set, appends this pid to that file and
    sleeps ``RELIABILITY_SLEEP`` seconds first (to kill or overlap a running ``prepare_data``)."""
    log = os.environ.get("RELIABILITY_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as handle:
            handle.write(f"{os.getpid()}\n")
        time.sleep(float(os.environ.get("RELIABILITY_SLEEP", "0")))
    return tokenize_text(examples, tokenizer, text_column=text_column)


class CountingLM(TinyCausalLM):
    """``TinyCausalLM`` whose step outputs also hold ``num_docs`` (rows of the batch)."""

    def step_outputs(self, batch: dict[str, Any]) -> dict[str, Any]:
        outputs = super().step_outputs(batch)
        outputs["num_docs"] = torch.tensor(float(batch["input_ids"].shape[0]))
        return outputs


def tokenize_unless_boom(examples: dict[str, list], tokenizer: Any) -> dict[str, list]:
    """Preprocess function that fails on rows whose text starts with ``BOOM`` (no BOS/EOS)."""
    for text in examples["text"]:
        if text.startswith("BOOM"):
            raise ValueError(f"boom: cannot tokenize {text!r}")
    return {"input_ids": [tokenizer.encode(text) for text in examples["text"]]}
