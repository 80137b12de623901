"""UnconditionalGenerationDatasetManager: BOS-only prompts, split across ranks without repeats."""

from __future__ import annotations

import pickle

import pytest
from source_files import BOS, TOK  # noqa: F401 - fixtures

from lightning_tune_data.managers import DataSourceError, UnconditionalGenerationDatasetManager, UnconditionalPrompts


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("num_examples", [1, 2, 7, 10, 12])
def test_unconditional_examples_split_across_ranks_cover_each_index_once(num_examples: int, world_size: int) -> None:
    manager = UnconditionalGenerationDatasetManager(num_examples=num_examples)
    blocks = [manager.examples_for_rank(rank, world_size) for rank in range(world_size)]
    assert sorted(i for block in blocks for i in block) == list(range(num_examples))
    assert [i for block in blocks for i in block] == list(range(num_examples))  # contiguous, in rank order
    sizes = [len(block) for block in blocks]
    assert max(sizes) - min(sizes) <= 1


def test_unconditional_setup_yields_bos_prompts_with_provenance() -> None:
    manager = UnconditionalGenerationDatasetManager(num_examples=5, stages=["predict"])
    manager.source_name = "unconditional_prediction"
    assert manager.prepare_data(TOK, "/nonexistent") is None
    prompts = manager.setup(TOK, None)
    assert isinstance(prompts, UnconditionalPrompts) and len(prompts) == 5
    items = list(prompts)
    assert [item["index"] for item in items] == [0, 1, 2, 3, 4]
    for item in items:
        assert item["input_ids"].tolist() == [BOS]
        assert (item["source"], item["epoch"]) == ("unconditional_prediction", 0)
    rank1 = manager.setup(TOK, None, rank=1, world_size=2)
    assert [item["index"] for item in rank1] == manager.examples_for_rank(1, 2) == [3, 4]
    assert prompts[3]["index"] == 3
    with pytest.raises(DataSourceError, match=r"has no cache"):
        manager.cache_dir_for(TOK, "/tmp")


def test_unconditional_rejects_bad_num_examples_and_rank() -> None:
    with pytest.raises(DataSourceError, match=r"num_examples must be an integer >= 1"):
        UnconditionalGenerationDatasetManager(num_examples=0)
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size\)"):
        UnconditionalGenerationDatasetManager(num_examples=3).examples_for_rank(2, 2)
