"""Every rank trains on the files rank 0 opened: a remote file replaced while a run starts (after
one node copied it, before another did) is named instead of giving two nodes different bytes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from conftest import make_texts, write_jsonl
from tokenized_writers import documents, write_megatron

from lightning_tune_data import LocalDatasetManager, TextDataModule, TokenizedDatasetManager
from lightning_tune_data.datamodule.corpus_agreement import check_files_agree, corpus_identities, disagreeing_files
from lightning_tune_data.managers import DataSourceError


def test_a_second_node_opening_a_file_replaced_after_the_first_did_is_named(tmp_path: Path, s3) -> None:
    for number in range(2):
        write_megatron(tmp_path / "corpus" / f"part-{number}", documents(30, seed=number))
    for path in sorted((tmp_path / "corpus").iterdir()):
        s3.put(f"corpus/{path.name}", path.read_bytes())
    write_jsonl(tmp_path / "text.jsonl", make_texts(20, seed=1))

    def node(name: str) -> dict:
        """A datamodule on a node of its own (an empty local cache), set up for fit."""
        managers = {"web": TokenizedDatasetManager(f"{s3.url}/corpus/", storage_options=s3.storage_options),
                    "text": LocalDatasetManager(data_files=str(tmp_path / "text.jsonl"))}
        dm = TextDataModule({"train": managers}, max_seq_len=32, batch_size=2, cache_dir=str(tmp_path / "cache"),
                            local_cache_dir=str(tmp_path / name))
        dm.prepare_data()
        dm.setup("fit")
        return corpus_identities(dm._datasets["train"])

    first = node("node-a")
    assert list(first) == ["web"] and disagreeing_files("web", node("node-b")["web"], first["web"]) is None
    s3.put("corpus/part-1.bin", (tmp_path / "corpus" / "part-1.bin").read_bytes()[::-1])  # same size, new bytes
    later = node("node-c")  # copied whole, after the file changed: its own copy is consistent, but not rank 0's
    problem = disagreeing_files("web", later["web"], first["web"], rank=3)
    assert problem is not None and "\n" not in problem
    assert f"{s3.url}/corpus/part-1.bin changed while the run started (rank 0 opened it as " in problem
    assert "rank 3 as " in problem and "Restart the run" in problem and "pinned copy" in problem


def test_files_missing_on_one_side_are_named() -> None:
    mine = [{"url": "s3://b/a.bin", "size": 4, "stamp": "x"}]
    assert "absent" in disagreeing_files("web", mine, [])
    assert "and 1 more file(s)" in disagreeing_files("web", mine + [{"url": "s3://b/b.bin", "size": 1, "stamp": "y"}],
                                                     [{"url": "s3://b/a.bin", "size": 4, "stamp": "z"}])


class _Corpus:
    def __init__(self, stamp: str) -> None:
        self.stamp = stamp

    def identity(self) -> list[dict]:
        return [{"url": "s3://b/corpus/a.bin", "size": 8, "stamp": self.stamp}]


def _rank(rank: int, init_file: str, out_dir: str, stamps: list[str]) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        check_files_agree({"web": _Corpus(stamps[rank]), "text": object()})
        outcome = "agreed"
    except DataSourceError as error:
        outcome = str(error)
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump(outcome, handle)


@pytest.mark.slow
def test_under_ddp_a_rank_whose_files_differ_from_rank_zeros_fails_naming_the_file(tmp_path: Path) -> None:
    mp.start_processes(_rank, args=(str(tmp_path / "init"), str(tmp_path), ["etag-1", "etag-2"]), nprocs=2,
                       start_method="spawn")
    outcomes = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert outcomes[0] == "agreed"
    assert outcomes[1].startswith("Source 'web': s3://b/corpus/a.bin changed while the run started (rank 0 opened "
                                  "it as 8 bytes, identity etag-1; rank 1 as 8 bytes, identity etag-2)")
    check_files_agree({"web": _Corpus("x")})  # no process group: nothing to compare
