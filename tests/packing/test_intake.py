"""DocumentIntake: document samples read one at a time, checked, cut by the overlong policy, placed."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_tune_data.packing import intake as intake_module
from lightning_tune_data.packing.intake import DocumentIntake
from lightning_tune_data.packing.packer import IterablePackedDataset
from lightning_tune_data.packing.pieces import NOT_REREADABLE, document_labels
from lightning_tune_data.packing.progress import PackingProgress
from lightning_tune_data.sources.memory import InMemoryStream


def _intake(strategy: str = "greedy", overlong: str = "truncate") -> tuple[DocumentIntake, PackingProgress]:
    progress = PackingProgress(strategy, 8, 4, overlong)
    return DocumentIntake(progress, "packed", "child", 8, overlong), progress


def test_a_re_readable_document_becomes_a_zero_copy_piece_with_its_reference():
    intake, progress = _intake()
    ids = np.arange(10, 15, dtype=np.int32)
    sample = {"input_ids": ids, "source": "web", "epoch": 2, "source_row": 41, "truncated_tokens": 3,
              "dropped_before": 1}
    ref, tokens, extra = intake.prepare(sample)
    assert ref == ("web", 41, 2, 0, 5, True, 3, 1)
    assert tokens is ids and extra is None  # the cache's integer views pass as they are
    assert progress.counters["documents"] == 1


def test_a_document_that_cannot_be_re_read_owns_its_tokens_and_mask():
    intake, _ = _intake()
    ids, mask = np.arange(6), np.array([False, False, True, True, True, True])
    ref, tokens, extra = intake.prepare({"input_ids": ids, "loss_mask": mask})
    assert ref[:2] == ("child", NOT_REREADABLE)  # no source: the child's name; no row: not re-readable
    assert np.array_equal(tokens, ids) and not np.shares_memory(tokens, ids)
    assert np.array_equal(extra.labels, document_labels(ids, mask))
    assert np.array_equal(extra.loss_mask, mask) and not np.shares_memory(extra.loss_mask, mask)


def test_a_masked_re_readable_document_carries_only_its_labels():
    intake, _ = _intake()
    ids, mask = np.arange(4), np.array([True, False, True, True])
    _, _, extra = intake.prepare({"input_ids": ids, "loss_mask": mask, "source_row": 0})
    assert extra.loss_mask is None and extra.labels.tolist() == [-100, 2, 3, -100]


def test_an_overlong_document_is_cut_and_counted_or_dropped_unless_the_strategy_splits_documents():
    sample = {"input_ids": np.arange(12), "loss_mask": np.ones(12, dtype=bool), "source_row": 3, "truncated_tokens": 2}
    truncating, progress = _intake(overlong="truncate")
    ref, tokens, extra = truncating.prepare(sample)
    assert len(tokens) == ref[4] == 8 and ref[6] == 2 + 4 and len(extra.labels) == 8
    assert extra.labels[-1] == -100 and progress.counters["overlong_truncated"] == 1
    dropping, progress = _intake(overlong="drop")
    assert dropping.prepare(sample) is None and progress.counters["overlong_dropped"] == 1
    splitting, progress = _intake(strategy="concat", overlong="drop")
    ref, tokens, _ = splitting.prepare(sample)
    assert len(tokens) == ref[4] == 12 and ref[6] == 2
    assert progress.counters["overlong_dropped"] == progress.counters["overlong_truncated"] == 0


def test_an_empty_document_is_not_packable_and_counted():
    intake, progress = _intake()
    assert intake.prepare({"input_ids": np.zeros(0, dtype=np.int64)}) is None
    assert progress.counters["empty_dropped"] == progress.counters["documents"] == 1


@pytest.mark.parametrize(
    ("sample", "error", "message"),
    [
        ({"labels": [1, 2]}, KeyError, r"a sample of 'child' has no 'input_ids' \(keys: \['labels'\]\)"),
        ({"input_ids": [[1, 2], [3, 4]], "source": "s"}, ValueError, r"from 's' has shape \(2, 2\).*1-D"),
        ({"input_ids": [1, 2, 3], "loss_mask": [True, False]}, ValueError, r"'loss_mask' .* shape \(2,\).*\(3,\)"),
    ],
)
def test_a_malformed_sample_is_a_clear_error(sample, error, message):
    intake, _ = _intake()
    with pytest.raises(error, match=message):
        intake.prepare(sample)


def test_placing_documents_counts_unusable_ones_in_a_row_and_closes_the_packs_at_the_end():
    intake, progress = _intake()
    documents = iter([{"input_ids": np.arange(5)}, {"input_ids": np.zeros(0, dtype=np.int64)},
                      {"input_ids": np.zeros(0, dtype=np.int64)}, {"input_ids": np.arange(4)}])
    assert intake.place_next(documents, 0) == 0
    assert intake.place_next(documents, 0) == 1
    assert intake.place_next(documents, 1) == 2
    assert intake.place_next(documents, 2) == 0  # a packable document resets the count
    assert [len(pack.refs) for pack in progress.placer.ready] == [1]  # 4 tokens do not fit after 5
    assert not progress.child_exhausted
    assert intake.place_next(documents, 0) == 0
    assert progress.child_exhausted and [pack.length for pack in progress.placer.ready] == [5, 4]
    assert not progress.placer.strategy.open


def test_a_stream_of_only_empty_documents_is_an_error_not_a_hang(monkeypatch):
    class Empties(InMemoryStream):
        def __iter__(self):
            while True:
                yield {"input_ids": np.zeros(0, dtype=np.int64), "source": "blank", "epoch": 0}

    packer = IterablePackedDataset(Empties([[1]], "blank"), 16, strategy="best_fit")
    monkeypatch.setattr(intake_module, "_MAX_UNUSABLE_IN_A_ROW", 50)
    with pytest.raises(RuntimeError, match=r"last 50 documents of 'blank'.*empty"):
        next(iter(packer))
