"""Split a per-token loss by the source each token's document came from.

Every train batch carries ``provenance`` (one entry per document, or document piece when packed,
with its ``source`` and ``row``). Packed batches also carry ``document_ids`` (``[B, L]``: the
index of the document inside its row, ``-1`` on padding); padded batches hold one document per
row. Together they say which document, hence which source, every label position belongs to.

:func:`split_loss_by_source` turns a per-token loss ``[B, L]`` into per-source *sums* and label
token *counts*. Sums and counts add up across batches and DDP ranks, so the per-source loss
``sum / count`` is exact however the tokens are spread (never a mean of per-rank means)::

    token_loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view_as(labels)
    split = split_loss_by_source(token_loss, batch, sources=["code", "prose"])
    split = split.all_reduce(self.trainer.strategy.reduce)  # under DDP: global sums, one collective
    for source, loss in split.means().items():
        self.log(f"train/{source}/loss", loss, on_step=True)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lightning_tune_data.keys import ATTENTION_MASK, DOCUMENT_IDS, IGNORE_INDEX, INPUT_IDS, LABELS, PROVENANCE, ROW, SOURCE

__all__ = ["SourceLossSplit", "document_index", "split_loss_by_source"]


def _rows_of(provenance: Mapping[str, Any], count: int) -> list[int]:
    """The batch row of each provenance entry (entry ``i`` is row ``i`` when there is no ``row`` column)."""
    rows = provenance.get(ROW)
    if rows is None:
        return list(range(count))  # a padded batch without row column: entry i is row i
    return [int(r) for r in (rows.tolist() if isinstance(rows, torch.Tensor) else rows)]


def document_index(batch: Mapping[str, Any]) -> torch.Tensor:
    """Index of each position's document into ``batch["provenance"]`` lists, ``-1`` where none.

    Args:
        batch: a train batch with ``provenance`` and either ``document_ids`` (packed) or
            ``attention_mask`` / ``input_ids`` (padded: one document per row).

    Returns:
        A ``[B, L]`` long tensor on the batch's device.

    Raises:
        ValueError: the provenance does not describe the batch's rows and documents.
    """
    provenance = batch.get(PROVENANCE)
    if not isinstance(provenance, Mapping) or SOURCE not in provenance:
        raise ValueError(
            "split_loss_by_source: the batch has no 'provenance' with a 'source' column; use a batch from a "
            "TextDataModule train loader (PaddedCollator / PackedCollator)."
        )
    count = len(provenance[SOURCE])
    rows = _rows_of(provenance, count)
    reference = batch.get(DOCUMENT_IDS)
    if reference is None:
        reference = batch.get(ATTENTION_MASK, batch.get(INPUT_IDS))
    if not isinstance(reference, torch.Tensor) or reference.dim() != 2:
        raise ValueError("split_loss_by_source: the batch needs [B, L] 'document_ids' or 'attention_mask' tensors.")
    batch_rows = reference.shape[0]
    per_row = [0] * batch_rows
    first = [0] * batch_rows
    for index, row in enumerate(rows):
        if not 0 <= row < batch_rows:
            raise ValueError(f"split_loss_by_source: provenance entry {index} names row {row}, the batch has {batch_rows}.")
        if per_row[row] == 0:
            first[row] = index
        per_row[row] += 1
    device = reference.device
    if DOCUMENT_IDS in batch:
        local = batch[DOCUMENT_IDS].long()
        if int(local.max()) >= 0:
            too_many = local >= torch.tensor(per_row, device=device)[:, None]
            if bool(too_many.any()):
                raise ValueError(
                    "split_loss_by_source: document_ids name more documents in a row than its provenance lists; "
                    "the provenance and the batch do not match."
                )
    else:
        if any(n != 1 for n in per_row):
            raise ValueError(
                f"split_loss_by_source: a padded batch holds one document per row, but the provenance lists "
                f"{per_row} entries per row."
            )
        mask = batch.get(ATTENTION_MASK)
        real = mask.bool() if isinstance(mask, torch.Tensor) else torch.ones_like(reference, dtype=torch.bool)
        local = torch.where(real, 0, -1)
    starts = torch.tensor(first, dtype=torch.long, device=device)[:, None]
    return torch.where(local >= 0, starts + local, torch.full_like(local, -1))


@dataclass
class SourceLossSplit:
    """Per-source loss sums and label-token counts of one batch (or of several, once added up).

    Attributes:
        sources: source names, in the order of the tensors.
        loss_sum: ``[S]`` float64 sum of the per-token loss over each source's label tokens.
        tokens: ``[S]`` float64 number of label tokens per source.
    """

    sources: list[str]
    loss_sum: torch.Tensor
    tokens: torch.Tensor

    def all_reduce(self, reduce: Callable[..., torch.Tensor] | None = None) -> SourceLossSplit:
        """Sums and counts over every rank, in one collective (a no-op without a process group).

        Args:
            reduce: the strategy's reduce (``trainer.strategy.reduce``, called with
                ``reduce_op="sum"``); ``None`` uses ``torch.distributed.all_reduce`` when a
                process group is initialised. Every rank must call this with the same ``sources``.
        """
        stacked = torch.stack([self.loss_sum, self.tokens])
        if reduce is not None:
            stacked = reduce(stacked, reduce_op="sum")
        elif torch.distributed.is_available() and torch.distributed.is_initialized():
            stacked = stacked.clone()
            torch.distributed.all_reduce(stacked)
        return SourceLossSplit(list(self.sources), stacked[0], stacked[1])

    def means(self) -> dict[str, torch.Tensor]:
        """``{source: token-weighted mean loss}`` for every source with at least one label token."""
        counts = self.tokens.tolist()  # one device sync for all sources
        return {source: self.loss_sum[i] / self.tokens[i] for i, source in enumerate(self.sources) if counts[i] > 0}


def split_loss_by_source(
    token_loss: torch.Tensor,
    batch: Mapping[str, Any],
    sources: Sequence[str] | None = None,
    labels: torch.Tensor | None = None,
) -> SourceLossSplit:
    """Sum a per-token loss over each source's label tokens.

    Args:
        token_loss: ``[B, L]`` loss per position (e.g. ``cross_entropy(..., reduction="none")``);
            positions whose label is ``-100`` are left out whatever their value.
        batch: the train batch (``labels``, ``provenance`` and ``document_ids`` or
            ``attention_mask``).
        sources: the source names to report, in a fixed order (e.g. the datamodule's
            ``train_source_weights`` keys). Under DDP pass the same list on every rank. ``None``:
            the sources of this batch in order of appearance.
        labels: the labels (default ``batch["labels"]``).

    Returns:
        A :class:`SourceLossSplit` (sums in float64, so adding many batches stays exact).

    Raises:
        ValueError: shapes differ, or the batch names a source not in ``sources``.
    """
    labels = batch[LABELS] if labels is None else labels
    if token_loss.shape != labels.shape:
        raise ValueError(
            f"split_loss_by_source: token_loss has shape {tuple(token_loss.shape)} but labels have "
            f"{tuple(labels.shape)}; pass the unreduced loss reshaped to [B, L]."
        )
    batch_sources = [str(s) for s in batch[PROVENANCE][SOURCE]]
    names = list(dict.fromkeys(batch_sources)) if sources is None else [str(s) for s in sources]
    position = {name: i for i, name in enumerate(names)}
    unknown = sorted(set(batch_sources) - set(position))
    if unknown:
        raise ValueError(
            f"split_loss_by_source: the batch holds documents of {unknown}, not among sources={names}; pass "
            "every train source name."
        )
    index = document_index(batch)
    device = token_loss.device
    entry_source = torch.tensor([position[s] for s in batch_sources], dtype=torch.long, device=device)
    target = (labels != IGNORE_INDEX) & (index >= 0)
    source_of = entry_source[index[target]]
    loss_sum = torch.zeros(len(names), dtype=torch.float64, device=device)
    tokens = torch.zeros(len(names), dtype=torch.float64, device=device)
    loss_sum.index_add_(0, source_of, token_loss[target].to(torch.float64))
    tokens.index_add_(0, source_of, torch.ones_like(source_of, dtype=torch.float64))
    return SourceLossSplit(names, loss_sum, tokens)
