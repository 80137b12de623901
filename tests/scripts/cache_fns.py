"""Preprocess functions for the cache tests (importable by dotted path from datasets workers)."""

from __future__ import annotations

from typing import Any


def ids_past_the_vocabulary(examples: dict[str, list], tokenizer: Any) -> dict[str, list]:
    """Byte ids, plus one id equal to ``vocab_size`` in the row whose text contains "BAD"."""
    out = []
    for text in examples["text"]:
        ids = [tokenizer.bos_id, *tokenizer.encode(text), tokenizer.eos_id]
        if "BAD" in text:
            ids.append(tokenizer.vocab_size)
        out.append(ids)
    return {"input_ids": out}
