"""CorpusSource: the files' identity saved with the position; changed files refused on resume;
exact and elastic resume as for any ArrowSource."""

from __future__ import annotations

import itertools
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from lightning_tune_data.formats.corpus import CorpusFile, TokenCorpus
from lightning_tune_data.keys import INPUT_IDS
from lightning_tune_data.sources.corpus_source import CorpusSource


def corpus_at(folder: Path, documents: int = 40) -> TokenCorpus:
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for name in ("a.bin", "b.bin"):
        lengths = np.random.default_rng(len(name) + documents).integers(1, 9, size=documents)
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        np.arange(offsets[-1], dtype=np.uint16).tofile(folder / name)
        stat = os.stat(folder / name)
        identity = [{"url": str(folder / name), "size": stat.st_size, "stamp": str(stat.st_mtime_ns)}]
        entries.append(CorpusFile(str(folder / name), "uint16", offsets, path=str(folder / name), identity=identity))
    return TokenCorpus(entries, "nanogpt", str(folder))


def ids(samples) -> list[list[int]]:
    return [sample[INPUT_IDS].tolist() for sample in samples]


def test_resume_after_k_documents_continues_exactly_and_saves_the_files(tmp_path: Path) -> None:
    corpus = corpus_at(tmp_path / "corpus")
    full = ids(itertools.islice(iter(CorpusSource(corpus, "web", seed=1)), 100))
    source = CorpusSource(corpus, "web", seed=1)
    first = ids(itertools.islice(iter(source), 30))
    state = source.state_dict()
    assert state["web"]["files"]["count"] == 2 and len(state["web"]["files"]["identity"]) == 2
    resumed = CorpusSource(pickle.loads(pickle.dumps(corpus)), "web", seed=1)  # as a new process has it
    resumed.load_state_dict(state)
    assert first + ids(itertools.islice(iter(resumed), 70)) == full


def test_states_of_two_shards_merge_into_one_reader_that_reads_what_they_left(tmp_path: Path) -> None:
    corpus = corpus_at(tmp_path / "corpus")
    states = []
    for rank in range(2):
        source = CorpusSource(corpus, "web", seed=2, rank=rank, world_size=2, num_passes=1)
        list(itertools.islice(iter(source), 10))
        states.append(source.state_dict())
    merged = CorpusSource(corpus, "web", seed=2, num_passes=1)
    merged.load_global_state(merged.merge_shard_states(states))
    assert len(list(merged)) == len(corpus) - 20


def test_a_resume_over_changed_files_fails_naming_them(tmp_path: Path) -> None:
    source = CorpusSource(corpus_at(tmp_path / "corpus"), "web", seed=1)
    list(itertools.islice(iter(source), 5))
    state = source.state_dict()
    changed = CorpusSource(corpus_at(tmp_path / "corpus", documents=41), "web", seed=1)
    with pytest.raises(ValueError, match=r"files of .*corpus changed since the checkpoint was written: \['.*a\.bin', '.*b\.bin'\]"):
        changed.load_state_dict(state)
    with pytest.raises(ValueError, match="changed since the checkpoint"):
        changed.merge_shard_states([state])
