"""The shared names: one spelling per key, and allowed values that match their Literal types."""

from __future__ import annotations

import typing

from lightning_tune_data import keys


def test_allowed_values_are_the_arguments_of_their_literal_types() -> None:
    assert keys.OVERLONG_POLICIES == typing.get_args(keys.OverlongPolicy) == ("truncate", "drop")
    assert keys.STOPPING_STRATEGIES == typing.get_args(keys.StoppingStrategy) == ("infinite", "first_exhausted", "all_exhausted")
    assert keys.MIX_BY == typing.get_args(keys.MixBy) == ("documents", "tokens")


def test_document_batch_and_provenance_keys_are_distinct_strings() -> None:
    names = [n for n in dir(keys) if n.isupper() and isinstance(getattr(keys, n), str)]
    values = [getattr(keys, n) for n in names]
    assert len(values) == len(set(values)), dict(zip(names, values))


def test_provenance_fields_list_every_per_document_key_once() -> None:
    assert len(set(keys.PROVENANCE_FIELDS)) == len(keys.PROVENANCE_FIELDS)
    assert {keys.SOURCE, keys.EPOCH, keys.TOKENS, keys.ROW, keys.NEW_DOCUMENT} <= set(keys.PROVENANCE_FIELDS)


def test_ignore_index_is_the_value_torch_losses_ignore_by_default() -> None:
    import torch

    logits = torch.zeros(2, 3)
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor([0, keys.IGNORE_INDEX]), reduction="sum")
    assert torch.isclose(loss, torch.log(torch.tensor(3.0)))
