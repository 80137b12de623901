"""Pack and PackedSample: pieces appended in order, prefixes, and the sample built on first access."""

from __future__ import annotations

import pickle

import numpy as np

from lightning_tune_data.keys import IGNORE_INDEX
from lightning_tune_data.packing.pack import Pack, PackedSample
from lightning_tune_data.packing.pieces import PieceExtra, reference


def _pack() -> Pack:
    pack = Pack()
    pack.add(reference("a", 0, 0, 3), np.array([1, 2, 3]))
    pack.add(reference("a", 1, 0, 2), np.array([4, 5]), PieceExtra(np.array([IGNORE_INDEX, IGNORE_INDEX]), None))
    pack.add(reference("b", 0, 1, 4), np.array([6, 7, 8, 9]))
    return pack


def test_extras_are_kept_only_from_the_first_piece_that_has_one():
    pack = Pack()
    pack.add(reference("a", 0, 0, 1), np.array([1]))
    assert pack.extras is None and pack.length == 1
    full = _pack()
    assert full.length == 9 and len(full.refs) == len(full.tokens) == 3
    assert full.extras[0] is None and full.extras[1].labels.tolist() == [IGNORE_INDEX, IGNORE_INDEX]
    assert len(full.extras) == 2  # the later pieces have none
    assert [extra for _, _, extra in full.pieces()][2] is None


def test_a_prefix_is_the_pack_as_it_was_with_its_first_pieces():
    pack = _pack()
    prefix = pack.prefix(2)
    assert prefix.length == 5 and prefix.refs == pack.refs[:2] and len(prefix.extras) == 2
    prefix.add(reference("c", 0, 0, 1), np.array([0]))
    assert len(pack.refs) == 3 and pack.length == 9  # the original does not grow with it


def test_the_sample_restarts_positions_and_labels_at_every_piece():
    sample = _pack().to_sample()
    assert sample["input_ids"].tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert sample["labels"].tolist() == [2, 3, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX, 7, 8, 9, IGNORE_INDEX]
    assert sample["position_ids"].tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]
    assert sample["document_ids"].tolist() == [0, 0, 0, 1, 1, 2, 2, 2, 2]
    assert sample["seq_lens"] == [3, 2, 4]
    assert [entry["source"] for entry in sample["provenance"]] == ["a", "a", "b"]


def test_a_packed_sample_builds_its_arrays_once_and_crosses_processes_as_a_dict():
    sample = PackedSample(_pack())
    assert list(sample) == list(PackedSample.KEYS) and len(sample) == 6
    assert sample["input_ids"] is sample["input_ids"]
    assert repr(sample) == "PackedSample(9 tokens, 3 documents)"
    copied = pickle.loads(pickle.dumps(sample))
    assert type(copied) is dict and copied["seq_lens"] == [3, 2, 4]
    rebuilt = PackedSample(copied)
    assert rebuilt.pack is None and np.array_equal(rebuilt["labels"], sample["labels"])
