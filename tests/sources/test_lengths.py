"""Document lengths from the cache's offsets, and the setup-time warning about overlong documents."""

from __future__ import annotations

import warnings
from pathlib import Path

import datasets
import numpy as np
import pytest
from conftest import write_jsonl

from lightning_tune_data import ByteTokenizer, LocalDatasetManager, TextDataModule
from lightning_tune_data.sources.lengths import document_lengths, overlong_summary, overlong_warnings


def test_lengths_come_from_the_offsets_in_row_order_and_follow_a_select() -> None:
    rows = [[1] * n for n in (3, 7, 1, 12, 5)]
    dataset = datasets.Dataset.from_dict({"input_ids": rows})
    assert document_lengths(dataset).tolist() == [3, 7, 1, 12, 5]
    assert document_lengths(dataset.select([3, 0])).tolist() == [12, 3]
    concatenated = datasets.concatenate_datasets([dataset, dataset.select([1])])  # several Arrow chunks
    assert document_lengths(concatenated).tolist() == [3, 7, 1, 12, 5, 7]


def test_lengths_reject_a_dataset_without_token_lists() -> None:
    with pytest.raises(ValueError, match="'input_ids' column"):
        document_lengths(datasets.Dataset.from_dict({"text": ["a"]}))
    with pytest.raises(ValueError, match="not lists of token ids"):
        document_lengths(datasets.Dataset.from_dict({"input_ids": [1, 2]}))


def test_warning_names_each_source_above_one_percent_of_overlong_documents() -> None:
    many = datasets.Dataset.from_dict({"input_ids": [[0] * n for n in [10] * 90 + [40] * 10]})  # 10% > 32
    few = datasets.Dataset.from_dict({"input_ids": [[0] * n for n in [10] * 199 + [40]]})  # 0.5%
    assert overlong_summary("many", many, 32).overlong == 10
    lines = overlong_warnings({"many": many, "few": few}, max_seq_len=32, overlong="truncate")
    assert lines == [
        "Train source 'many': 10 of 100 documents (10.0%) are longer than max_seq_len=32 and will be cut to their "
        "first max_seq_len tokens (overlong='truncate'). Raise max_seq_len, or use packing='concat' to keep every token."
    ]
    assert "will be dropped" in overlong_warnings({"many": many}, 32, "drop")[0]


def test_datamodule_setup_warns_once_per_overlong_source(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "long.jsonl", ["x" * 80] * 5 + ["short"] * 45)  # 10% longer than 64 tokens
    write_jsonl(tmp_path / "short.jsonl", ["short text"] * 30)
    datamodule = TextDataModule(
        dataset_managers={"train": {"long": LocalDatasetManager(data_files=str(tmp_path / "long.jsonl")),
                                    "short": LocalDatasetManager(data_files=str(tmp_path / "short.jsonl"))}},
        tokenizer=ByteTokenizer(), max_seq_len=64, cache_dir=str(tmp_path / "cache"),
    )
    datamodule.prepare_data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        datamodule.setup("fit")
        datamodule.setup("fit")
    messages = [str(w.message) for w in caught if "longer than max_seq_len" in str(w.message)]
    assert len(messages) == 1 and messages[0].startswith("Train source 'long': 5 of 50 documents (10.0%)")
    assert np.array_equal(document_lengths(datamodule._datasets["train"]["long"])[:5], [82] * 5)  # BOS + 80 + EOS
