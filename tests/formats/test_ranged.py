"""A remote corpus larger than its share of the node's cache_budget, read by byte ranges through
the node's shard cache on the S3 stand-in: same documents as the local read, disk within the
budget plus one range, ranges shared by the node's readers, a file changed under the run named."""

from __future__ import annotations

import multiprocessing
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from tokenized_writers import (
    documents,
    litdata_documents,
    mds_documents,
    write_datatrove,
    write_litdata,
    write_llmc,
    write_mds,
    write_megatron,
)

from lightning_tune_data import TokenizedDatasetManager
from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.formats import ranged
from lightning_tune_data.formats.files import LOCAL_COPIES_FOLDER
from lightning_tune_data.formats.ranged import RangedCorpus, cut_ranges
from lightning_tune_data.managers import DataSourceError
from lightning_tune_data.sources.corpus_source import CorpusSource

RANGE = 2048


def upload(s3, folder: Path, prefix: str) -> None:
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            s3.put(f"{prefix}/{path.relative_to(folder).as_posix()}", path.read_bytes())


def megatron_corpus(tmp_path: Path, s3) -> list[np.ndarray]:
    docs = []
    for number in range(3):
        part = documents(150, seed=40 + number, longest=60)
        write_megatron(tmp_path / "corpus" / f"part-{number}", part)
        docs += part
    upload(s3, tmp_path / "corpus", "corpus")
    return docs


def root(tmp_path: Path, budget: int, sharers: int = 1) -> StoreRoot:
    return StoreRoot(str(tmp_path / "node"), cache_budget=budget, budget_sharers=sharers)


def read_all(corpus, seed: int = 0) -> list[list[int]]:
    return [sample["input_ids"].tolist() for sample in CorpusSource(corpus, "web", seed=seed, num_passes=1)]


def test_cut_ranges_end_at_document_boundaries_and_keep_a_large_document_whole() -> None:
    offsets = np.array([0, 100, 200, 1500, 1600, 1700])
    assert cut_ranges(offsets, 2, 400) == [(0, 2), (2, 3), (3, 5)]
    assert cut_ranges(offsets, 2, 1 << 20) == [(0, 5)]


def test_a_corpus_larger_than_its_budget_reads_the_local_documents_within_budget_plus_one_range(
        tmp_path: Path, s3, monkeypatch) -> None:
    monkeypatch.setattr(ranged, "RANGE_BYTES", RANGE)
    docs = megatron_corpus(tmp_path, s3)
    budget = 5 * RANGE
    manager = TokenizedDatasetManager(f"{s3.url}/corpus/", storage_options=s3.storage_options)
    corpus = manager.setup(None, root(tmp_path, budget))
    assert isinstance(corpus, RangedCorpus) and corpus.num_shards > 10
    local = TokenizedDatasetManager(str(tmp_path / "corpus")).setup(None, tmp_path / "local")
    source, seen, largest = CorpusSource(corpus, "web", seed=5, num_passes=1), [], max(e["size"] for e in corpus.shards)
    for number, sample in enumerate(source):
        seen.append(sample["input_ids"].tolist())
        if number % 20 == 0:
            assert corpus.cache.node_usage() <= budget + largest
    assert sorted(seen) == sorted(doc.tolist() for doc in docs)
    assert sorted(seen) == sorted(read_all(local))
    assert not list((tmp_path / "node" / LOCAL_COPIES_FOLDER).rglob("*.bin"))  # never copied whole
    bins = sum(s3.requests.gets(f"corpus/part-{n}.bin") for n in range(3))
    assert bins >= corpus.num_shards  # read range by range (some again after eviction)


def bytes_under(folder: Path) -> int:
    """Bytes of the files under ``folder`` (a file the prefetcher evicts meanwhile counts nothing)."""
    total = 0
    for path in folder.rglob("*"):
        try:
            total += path.stat().st_size if path.is_file() else 0
        except FileNotFoundError:
            pass
    return total


@pytest.mark.parametrize(("format", "remote"), [("mds", True), ("litdata", True), ("mds", False)])
def test_shards_to_decode_are_units_of_the_node_cache_within_budget(tmp_path: Path, s3, format, remote) -> None:
    docs = documents(300, seed=17, longest=60)
    if format == "mds":
        write_mds(tmp_path / "corpus", docs, "zstd")  # 64 shards of about 700 bytes
    else:
        write_litdata(tmp_path / "corpus", docs, tokens_loader=False)  # items with a size header each
    upload(s3, tmp_path / "corpus", "corpus")
    budget = 4096  # of about 36 KB (MDS: int32) or 18 KB (LitData: uint16) of decoded ids
    if remote:
        manager = TokenizedDatasetManager(f"{s3.url}/corpus/", storage_options=s3.storage_options)
    else:  # a local compressed corpus: decoded into the node cache too when there is a budget
        manager = TokenizedDatasetManager(str(tmp_path / "corpus"))
    corpus = manager.setup(None, root(tmp_path, budget))
    assert isinstance(corpus, RangedCorpus) and all("decode" in entry for entry in corpus.shards)
    assert corpus.num_tokens * np.dtype(corpus.corpus.dtype).itemsize > 4 * budget
    largest, seen = max(entry["size"] for entry in corpus.shards), []
    for number, sample in enumerate(CorpusSource(corpus, "web", seed=5, num_passes=1)):
        seen.append(sample["input_ids"].tolist())
        if number % 10 == 0:
            on_disk = bytes_under(tmp_path / "node" / "shard-cache")
            assert corpus.cache.node_usage() <= budget + largest and on_disk <= budget + largest
    theirs = mds_documents(tmp_path / "corpus") if format == "mds" else litdata_documents(tmp_path / "corpus")
    worker_copy = pickle.loads(pickle.dumps(corpus))  # as a dataloader worker gets it
    assert read_all(worker_copy, seed=5) == seen
    assert sorted(seen) == sorted(doc.tolist() for doc in theirs) == sorted(doc.tolist() for doc in docs)
    if not remote:
        (tmp_path / "corpus" / "shard.00003.mds.zstd").write_bytes(b"changed")  # a file changed under the run
        for reader in (corpus, worker_copy):  # their prefetch threads end before the node cache is emptied
            reader.cache.close()
        shutil.rmtree(tmp_path / "node" / "shard-cache")
        with pytest.raises(DataSourceError, match=r"shard\.00003\.mds\.zstd changed while the run read it"):
            read_all(corpus)
    outside = [p for p in (tmp_path / "node" / LOCAL_COPIES_FOLDER).rglob("*") if p.is_file()]
    assert not [p for p in outside if p.name == "tokens.npy"]  # no decoded copy outside the budget
    index = (tmp_path / "corpus" / "index.json").stat().st_size
    bound = index + len(corpus.shards) * 512 + 8 * len(docs)  # index, headers, boundaries: documented bound
    assert sum(p.stat().st_size for p in outside) <= bound


def _read_in_child(corpus: RangedCorpus, queue) -> None:  # noqa: ANN001
    queue.put(read_all(corpus, seed=1))


@pytest.mark.slow
def test_readers_of_one_node_share_its_ranges(tmp_path: Path, s3, monkeypatch) -> None:
    monkeypatch.setattr(ranged, "RANGE_BYTES", RANGE)
    docs = megatron_corpus(tmp_path, s3)
    manager = TokenizedDatasetManager(f"{s3.url}/corpus/", storage_options=s3.storage_options)
    corpus = manager.setup(None, root(tmp_path, 1 << 20, sharers=64))  # the node holds it all; the share does not
    assert isinstance(corpus, RangedCorpus)
    before = sum(s3.requests.gets(f"corpus/part-{n}.bin") for n in range(3))
    context, queue = multiprocessing.get_context("fork"), multiprocessing.get_context("fork").Queue()
    children = [context.Process(target=_read_in_child, args=(corpus, queue)) for _ in range(2)]
    for child in children:
        child.start()
    got = [queue.get(timeout=120) for _ in children]
    for child in children:
        child.join(timeout=60)
    assert got[0] == got[1] and sorted(got[0]) == sorted(doc.tolist() for doc in docs)
    fetched = sum(s3.requests.gets(f"corpus/part-{n}.bin") for n in range(3)) - before
    assert fetched == corpus.num_shards  # each range once for the node
    assert read_all(corpus, seed=1) == got[0]
    assert sum(s3.requests.gets(f"corpus/part-{n}.bin") for n in range(3)) - before == fetched


def test_loss_masks_and_documents_joined_across_files_travel_in_ranges(tmp_path: Path, s3, monkeypatch) -> None:
    monkeypatch.setattr(ranged, "RANGE_BYTES", 512)
    docs = documents(120, seed=7, longest=30)
    losses = [np.arange(len(doc)) % 3 != 0 for doc in docs]
    write_datatrove(tmp_path / "dt", "000_part.ds", docs, losses)
    upload(s3, tmp_path / "dt", "dt")
    manager = TokenizedDatasetManager(f"{s3.url}/dt/", storage_options=s3.storage_options)
    corpus = manager.setup(None, root(tmp_path, 6 * 1024))
    assert isinstance(corpus, RangedCorpus)
    samples = [(s["input_ids"].tolist(), s["loss_mask"].tolist())  # lists: a view would keep its range mapped
               for s in CorpusSource(corpus, "web", shuffle=False, num_passes=1)]
    assert samples == [(doc.tolist(), loss.tolist()) for doc, loss in zip(docs, losses)]
    write_llmc(tmp_path / "llmc", [np.concatenate([[999], doc[:-1]]) for doc in docs], shard_tokens=700)
    upload(s3, tmp_path / "llmc", "llmc")
    remote = TokenizedDatasetManager(f"{s3.url}/llmc/", format="llmc", eos_id=999, storage_options=s3.storage_options)
    local = TokenizedDatasetManager(str(tmp_path / "llmc"), format="llmc", eos_id=999)
    corpus = remote.setup(None, root(tmp_path / "llmc-node", 6 * 1024))
    assert isinstance(corpus, RangedCorpus) and any("memory" in entry for entry in corpus.shards)
    want = [s["input_ids"].tolist() for s in CorpusSource(local.setup(None, tmp_path / "local"), "x", shuffle=False,
                                                          num_passes=1)]
    assert [s["input_ids"].tolist() for s in CorpusSource(corpus, "x", shuffle=False, num_passes=1)] == want


def test_a_file_changed_under_the_run_is_named(tmp_path: Path, s3, monkeypatch) -> None:
    monkeypatch.setattr(ranged, "RANGE_BYTES", RANGE)
    megatron_corpus(tmp_path, s3)
    manager = TokenizedDatasetManager(f"{s3.url}/corpus/", storage_options=s3.storage_options)
    corpus = manager.setup(None, root(tmp_path, 5 * RANGE))
    corpus.open_shard(0)
    s3.put("corpus/part-2.bin", (tmp_path / "corpus" / "part-2.bin").read_bytes()[::-1])
    last = corpus.num_shards - 1
    with pytest.raises(DataSourceError, match=r"corpus/part-2\.bin changed while the run read it"):
        corpus.open_shard(last)


def test_a_budget_too_small_for_two_ranges_says_how_much_is_needed(tmp_path: Path, s3, monkeypatch) -> None:
    monkeypatch.setattr(ranged, "RANGE_BYTES", RANGE)
    megatron_corpus(tmp_path, s3)
    manager = TokenizedDatasetManager(f"{s3.url}/corpus/", storage_options=s3.storage_options)
    with pytest.raises(ValueError, match=r"cannot hold two byte ranges of its files .* Raise cache_budget to at least"):
        manager.setup(None, root(tmp_path, RANGE))


def test_ids_beyond_the_vocabulary_are_named_when_their_range_is_read(tmp_path: Path, s3, monkeypatch) -> None:
    monkeypatch.setattr(ranged, "RANGE_BYTES", RANGE)
    megatron_corpus(tmp_path, s3)
    manager = TokenizedDatasetManager(f"{s3.url}/corpus/", vocab_size=500, storage_options=s3.storage_options)
    corpus = manager.setup(None, root(tmp_path, 5 * RANGE))
    assert isinstance(corpus, RangedCorpus)
    with pytest.raises(ValueError, match=r"corpus/part-0\.bin holds id \d+ at token \d+, beyond the tokenizer's "
                                         r"vocabulary of 500"):
        corpus.open_shard(0)


def test_two_ranks_states_merge_into_one_reader_that_reads_what_they_left(tmp_path: Path, s3, monkeypatch) -> None:
    import itertools

    monkeypatch.setattr(ranged, "RANGE_BYTES", RANGE)
    docs = megatron_corpus(tmp_path, s3)
    manager = TokenizedDatasetManager(f"{s3.url}/corpus/", storage_options=s3.storage_options)
    corpus = manager.setup(None, root(tmp_path, 5 * RANGE))
    states, seen = [], []
    for rank in range(2):
        source = CorpusSource(corpus, "web", seed=2, rank=rank, world_size=2, num_passes=1)
        seen += [sample["input_ids"].tolist() for sample in itertools.islice(iter(source), 30)]
        states.append(source.state_dict())
    merged = CorpusSource(corpus, "web", seed=2, num_passes=1)  # an elastic resume on one rank
    merged.load_global_state(merged.merge_shard_states(states))
    seen += [sample["input_ids"].tolist() for sample in merged]
    assert sorted(seen) == sorted(doc.tolist() for doc in docs)  # every document once
