"""PackingCounts: positions, padding and packed rows of real padded and packed batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lightning_tune_data import InMemoryStream, IterablePackedDataset, PackedCollator, PaddedCollator
from lightning_tune_data.metrics.packing_counts import (
    PACKED_ROW_DOCS,
    PACKED_ROWS,
    PACKING_COUNTERS,
    PADDING_POSITIONS,
    TOTAL_POSITIONS,
    PackingCounts,
)

PAD = 258


def docs(*lengths: int) -> list[dict]:
    return [{"input_ids": np.arange(1, n + 1), "source": "a", "epoch": 0} for n in lengths]


def stream_metrics(counts: PackingCounts) -> dict:
    stream: dict = {}
    PackingCounts.add_stream_metrics(counts.state_dict(), stream)
    return stream


def test_padded_batches_count_padding_but_no_packed_rows() -> None:
    batch = PaddedCollator(pad_id=PAD)(docs(5, 2, 3))
    counts = PackingCounts()
    counts.add(batch, len(batch["provenance"]["source"]))
    assert counts.state_dict() == {TOTAL_POSITIONS: 15, PADDING_POSITIONS: 5, PACKED_ROWS: 0, PACKED_ROW_DOCS: 0}
    assert stream_metrics(counts) == {"padding_share": pytest.approx(5 / 15)}


def test_packed_batches_count_rows_and_document_pieces() -> None:
    stream = InMemoryStream([np.arange(1, n + 1) for n in (3, 4, 6)], "a", shuffle=False, num_passes=1)
    packs = list(IterablePackedDataset(stream, max_seq_len=8, strategy="greedy"))
    assert [list(p["seq_lens"]) for p in packs] == [[3, 4], [6]]
    batch = PackedCollator(pad_id=PAD, max_seq_len=8)(packs)
    counts = PackingCounts()
    counts.add(batch, len(batch["provenance"]["source"]))
    counts.add(batch, len(batch["provenance"]["source"]))
    real = int((batch["document_ids"] >= 0).sum())
    positions = batch["document_ids"].numel()
    assert counts.state_dict() == {TOTAL_POSITIONS: 2 * positions, PADDING_POSITIONS: 2 * (positions - real),
                                   PACKED_ROWS: 4, PACKED_ROW_DOCS: 6}
    assert stream_metrics(counts) == {
        "padding_share": pytest.approx(1 - real / positions),
        "packing_efficiency": pytest.approx(real / positions),
        "docs_per_pack": 1.5,
    }


def test_document_ids_alone_give_the_padding_and_a_1d_row_counts_once() -> None:
    counts = PackingCounts()
    counts.add({"document_ids": torch.tensor([0, 0, 1, -1])}, 2)
    counts.add({"input_ids": torch.zeros(2, 3)}, 2)  # neither mask nor document ids: nothing to count
    assert counts.state_dict() == {TOTAL_POSITIONS: 4, PADDING_POSITIONS: 1, PACKED_ROWS: 1, PACKED_ROW_DOCS: 2}


def test_no_batch_yet_reports_nothing_and_states_sum_over_ranks() -> None:
    assert stream_metrics(PackingCounts()) == {}
    first, second = PackingCounts(), PackingCounts()
    first.add({"attention_mask": torch.tensor([[1, 1, 0]])}, 1)
    second.add({"attention_mask": torch.tensor([[1, 0, 0]]), "document_ids": torch.tensor([[0, -1, -1]])}, 1)
    summed = PackingCounts.summed([first.state_dict(), second.state_dict()])
    assert summed == {TOTAL_POSITIONS: 6, PADDING_POSITIONS: 3, PACKED_ROWS: 1, PACKED_ROW_DOCS: 1}
    assert PackingCounts.folded([first.state_dict(), second.state_dict(), {}]) == summed
    assert list(summed) == list(PACKING_COUNTERS)


def test_state_round_trips_and_a_missing_counter_restarts_at_zero() -> None:
    counts = PackingCounts()
    counts.load_state_dict({TOTAL_POSITIONS: 10, PADDING_POSITIONS: 4})
    assert counts.state_dict() == {TOTAL_POSITIONS: 10, PADDING_POSITIONS: 4, PACKED_ROWS: 0, PACKED_ROW_DOCS: 0}
    counts.add({"attention_mask": torch.ones(1, 2)}, 1)
    restored = PackingCounts()
    restored.load_state_dict(counts.state_dict())
    assert restored.state_dict() == counts.state_dict() == {TOTAL_POSITIONS: 12, PADDING_POSITIONS: 4,
                                                           PACKED_ROWS: 0, PACKED_ROW_DOCS: 0}
