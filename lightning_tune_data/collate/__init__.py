"""Collators: turn lists of samples into batches of tensors plus a provenance side channel.

Both collators run inside dataloader workers on the hot path, so they write every output of a
batch into one preallocated tensor through its numpy views, with a few whole-batch operations
(never a Python loop per token): the documents' tokens are concatenated once and scattered into
their rows, labels are the padded ids shifted by one wherever there is a target.

The label contract: ``labels`` are **already shifted**. The label at
position ``i`` is the token the model must predict at position ``i``, i.e. ``input_ids[i + 1]``
of the *same document*, or ``-100`` (ignored) where there is no target: at each document's last
token, on padding, and where the next token is a masked prompt token.

The provenance side channel is a dict of plain Python lists with one entry per document in the
batch (``source``, ``epoch``, ``tokens``, ``row``, ``new_document``, ``target_tokens``: how many
of the document's labels are targets; packed batches also carry
every other key of the packer's per-document provenance, such as ``truncated_tokens`` and
``dropped_before``). It is small, crosses the worker boundary cheaply, and feeds the per-source
metrics and per-source losses in the main process.

With ``compact=True`` both write a *compact* batch instead (token ids, lengths, a target mask only
when a document masks targets, provenance: :mod:`lightning_tune_data.collate.compact`) for a
dataloader worker to send, and :func:`expand_batch` derives the full batch from it after transfer.

``PackedCollator`` builds a batch of the packer's own packs (``PackedSample``) in bulk from their
document pieces; any other packed samples (plain dicts) are validated and copied row by row.
"""

from __future__ import annotations

from lightning_tune_data.collate.base import shifted_labels
from lightning_tune_data.collate.expand import expand_batch
from lightning_tune_data.collate.packed import PackedCollator
from lightning_tune_data.collate.provenance import packed_provenance
from lightning_tune_data.collate.padded import PaddedCollator
from lightning_tune_data.keys import (
    ATTENTION_MASK,
    DOCUMENT_IDS,
    DROPPED_BEFORE,
    EPOCH,
    IGNORE_INDEX,
    INPUT_IDS,
    LABELS,
    LOSS_MASK,
    NEW_DOCUMENT,
    PAD_DOCUMENT_ID,
    POSITION_IDS,
    PROVENANCE,
    ROW,
    SEQ_LENS,
    SOURCE,
    TOKENS,
    TRUNCATED_TOKENS,
)

__all__ = [
    "ATTENTION_MASK",
    "DOCUMENT_IDS",
    "DROPPED_BEFORE",
    "EPOCH",
    "IGNORE_INDEX",
    "INPUT_IDS",
    "LABELS",
    "LOSS_MASK",
    "NEW_DOCUMENT",
    "PAD_DOCUMENT_ID",
    "POSITION_IDS",
    "PROVENANCE",
    "PackedCollator",
    "PaddedCollator",
    "ROW",
    "SEQ_LENS",
    "SOURCE",
    "TOKENS",
    "TRUNCATED_TOKENS",
    "expand_batch",
    "packed_provenance",
    "shifted_labels",
]
