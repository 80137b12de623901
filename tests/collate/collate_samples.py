"""Small collator inputs built by hand: document samples, packed samples, and expected-array shorthands."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lightning_tune_data.collate import IGNORE_INDEX, shifted_labels

PAD = 99
X = IGNORE_INDEX  # short alias for "no target" in expected arrays


def doc(ids: list[int], source: str = "a", epoch: int = 0, mask: list[bool] | None = None) -> dict[str, Any]:
    """A document sample as the stream yields it."""
    sample: dict[str, Any] = {"input_ids": np.asarray(ids, dtype=np.int32), "source": source, "epoch": epoch}
    if mask is not None:
        sample["loss_mask"] = np.asarray(mask, dtype=bool)
    return sample


def pack(documents: list[dict[str, Any]], new_document: list[bool] | None = None) -> dict[str, Any]:
    """A packed sample built the way the packer must: labels shifted per document, then joined."""
    flags = new_document or [True] * len(documents)
    ids = [np.asarray(d["input_ids"], dtype=np.int32) for d in documents]
    return {
        "input_ids": np.concatenate(ids),
        "labels": np.concatenate([shifted_labels(i, d.get("loss_mask")) for i, d in zip(ids, documents)]),
        "position_ids": np.concatenate([np.arange(len(i)) for i in ids]),
        "document_ids": np.concatenate([np.full(len(i), k) for k, i in enumerate(ids)]),
        "seq_lens": [len(i) for i in ids],
        "provenance": [
            {"source": d["source"], "epoch": d["epoch"], "tokens": len(i), "new_document": flag}
            for d, i, flag in zip(documents, ids, flags)
        ],
    }


def rows(tensor: torch.Tensor) -> list[list[int]]:
    return tensor.tolist()
