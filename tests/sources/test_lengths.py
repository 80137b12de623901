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


def brute_force_no_target(masks: list[list[bool]], max_seq_len: int | None, overlong: str) -> tuple[int, int]:
    """(documents handed out, those without a target label once cut), row by row."""
    kept = [m for m in masks if m and not (overlong == "drop" and max_seq_len is not None and len(m) > max_seq_len)]
    cut = [m if max_seq_len is None else m[:max_seq_len] for m in kept]
    return len(kept), sum(1 for m in cut if not any(m[1:]))  # the first token is never a label


@pytest.mark.parametrize("rows_per_read", [7, 1 << 16])
@pytest.mark.parametrize("overlong", ["truncate", "drop"])
def test_no_target_documents_match_a_row_by_row_count_over_chunks_blocks_and_selects(
        monkeypatch, rows_per_read: int, overlong: str) -> None:
    from lightning_tune_data.sources import lengths
    from lightning_tune_data.sources.lengths import no_target_summary

    monkeypatch.setattr(lengths, "_ROWS_PER_READ", rows_per_read)
    rng = np.random.default_rng(3)
    masks = [(rng.random(int(rng.choice([0, 1, 2, rng.integers(3, 40)]))) < 0.15).tolist() for _ in range(400)]
    masked = datasets.Dataset.from_dict({"input_ids": [[1] * len(m) for m in masks], "loss_mask": masks})
    chunked = datasets.concatenate_datasets([masked, masked.select(range(50))])  # several Arrow chunks
    view = chunked.shuffle(seed=1).select(range(120))
    for dataset in (masked, chunked, view):
        rows = dataset["loss_mask"]
        for max_seq_len in (None, 1, 2, 5, 12, 64):
            summary = no_target_summary("sft", dataset, max_seq_len, overlong)
            assert (summary.documents, summary.no_target) == brute_force_no_target(rows, max_seq_len, overlong)


def test_a_source_without_a_loss_mask_has_no_target_summary() -> None:
    from lightning_tune_data.sources.lengths import no_target_summary

    assert no_target_summary("web", datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]]}), 2) is None


def test_overlong_warning_never_suggests_concat_for_a_masked_source() -> None:
    rows = [[0] * 40] * 10
    masked = datasets.Dataset.from_dict({"input_ids": rows, "loss_mask": [[False] * 20 + [True] * 20] * 10})
    plain = datasets.Dataset.from_dict({"input_ids": rows})
    sft, web = overlong_warnings({"sft": masked, "web": plain}, max_seq_len=32, overlong="truncate")
    assert "concat" not in sft and sft.endswith("Raise max_seq_len or shorten the documents (their prompts).")
    assert "packing='concat'" in web
