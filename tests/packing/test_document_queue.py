"""DocumentQueue: a block's documents not placed yet."""

from __future__ import annotations

import numpy as np

from lightning_tune_data.packing.document_queue import DocumentQueue
from lightning_tune_data.packing.pieces import PieceExtra, reference


def test_the_length_is_the_documents_not_placed_yet_and_the_ends_are_cumulative():
    queue = DocumentQueue([reference("s", row, 0, n) for row, n in enumerate([3, 5, 2])], [0, 3, 8], block="b")
    assert len(queue) == 3 and queue
    assert queue.ends() == [3, 8, 10] and queue.ends() is queue.ends()  # computed once
    queue.at = 3
    assert len(queue) == 0 and not queue
    assert not DocumentQueue()


def test_the_first_documents_form_a_new_queue_with_nothing_placed():
    extras = [None, PieceExtra(np.array([1]), None), None]
    queue = DocumentQueue([reference("s", row, 0, 1) for row in range(3)], [0, 1, 2], extras, block="b")
    queue.at = 2
    first = queue.first(2)
    assert first.at == 0 and len(first) == 2 and first.block is None
    assert first.refs == queue.refs[:2] and first.tokens == [0, 1] and first.extras == extras[:2]
    assert DocumentQueue(queue.refs, queue.tokens).first(1).extras is None
