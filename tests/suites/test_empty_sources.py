"""Sources whose documents are empty after tokenization end in a clear error, never a hang or a zero-width batch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_tune_data import LocalDatasetManager, TextDataModule


def datamodule(tmp_path: Path, texts: list[str], packing: str | None, num_workers: int = 0) -> TextDataModule:
    path = tmp_path / "blank.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    manager = LocalDatasetManager(data_files=str(path), preprocess_kwargs={"add_bos": False, "add_eos": False})
    dm = TextDataModule({"train": {"blank": manager}}, max_seq_len=32, batch_size=2, packing=packing,
                        num_workers=num_workers, cache_dir=str(tmp_path / "cache"))
    dm.prepare_data()
    dm.setup("fit")
    return dm


@pytest.mark.timeout(120)
@pytest.mark.parametrize("packing", [None, "greedy", "best_fit", "concat"])
def test_a_source_of_only_empty_documents_fails_naming_it_for_every_packing(tmp_path, packing):
    dm = datamodule(tmp_path, [""] * 8, packing)
    with pytest.raises(RuntimeError, match=r"Source 'blank'.*shard 0 of 1.*no usable document.*empty: 8"):
        next(iter(dm.train_dataloader()))


@pytest.mark.timeout(120)
def test_empty_documents_among_others_are_skipped_and_never_make_a_zero_width_batch(tmp_path):
    dm = datamodule(tmp_path, ["", "ab", "", "cde", ""] * 4, None)
    iterator = iter(dm.train_dataloader())
    widths = [next(iterator)["input_ids"].shape[1] for _ in range(10)]
    assert min(widths) >= 2


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_one_worker_shard_with_only_empty_documents_fails_naming_the_shard(tmp_path):
    dm = datamodule(tmp_path, ["x", ""] * 6, "best_fit", num_workers=2)
    dm.dataset_managers["train"]["blank"].shuffle = False  # shard 1 of 2 gets only the empty rows
    with pytest.raises(RuntimeError, match=r"Source 'blank'.*shard 1 of 2"):
        for _ in zip(range(50), dm.train_dataloader()):
            pass
