"""``HFStreamingSource`` over a real ``datasets`` stream (local JSONL, tokenised lazily by ``.map``).

Every row's text starts with ``"row <i>:"`` and its ``input_ids`` are the UTF-8 bytes of the
text, so a sample can be traced back to its row. Checks: infinite passes that reshuffle and
visit every row once; bitwise-exact resume from ``state_dict`` (mid-pass, across a pass
boundary, with a partly filled buffer); disjoint rows across real ``StatefulDataLoader``
workers and simulated ranks; exact resume through the loader's own state; seeding.
"""

from __future__ import annotations

import io
import itertools
import json
import pickle
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytest
import torch
from datasets.distributed import split_dataset_by_node
from torchdata.stateful_dataloader import StatefulDataLoader

from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.hf_streaming import HFStreamingSource

NUM_ROWS = 200
WORDS = ["alpha", "beta", "gamma", "delta", "stream", "resume", "token", "shard"]

datasets.disable_progress_bars()


def tokenize(example: dict[str, Any]) -> dict[str, Any]:
    """Bytes of the text as token ids; the ``"row <i>:"`` prefix is the prompt (masked out)."""
    ids = list(example["text"].encode("utf-8"))
    prompt = example["text"].index(":") + 1
    return {"input_ids": ids, "loss_mask": [i >= prompt for i in range(len(ids))]}


def row_texts() -> list[str]:
    rng = np.random.default_rng(0)
    return [f"row {i}: " + " ".join(rng.choice(WORDS, size=int(rng.integers(1, 12)))) for i in range(NUM_ROWS)]


def write_jsonl(path: Path, texts: list[str]) -> Path:
    with path.open("w", encoding="utf-8") as handle:
        for text in texts:
            handle.write(json.dumps({"text": text}) + "\n")
    return path


@pytest.fixture
def jsonl_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "rows.jsonl", row_texts())


@pytest.fixture
def make_stream(jsonl_file: Path) -> Callable[..., datasets.IterableDataset]:
    """A fresh lazily tokenised ``datasets`` stream over the JSONL file."""

    def make(transform: Callable[[dict[str, Any]], dict[str, Any]] = tokenize) -> datasets.IterableDataset:
        stream = datasets.load_dataset("json", data_files=str(jsonl_file), split="train", streaming=True)
        return stream.map(transform, remove_columns=["text"])

    return make


@pytest.fixture
def make_source(make_stream: Callable[..., datasets.IterableDataset]) -> Callable[..., HFStreamingSource]:
    def make(**kwargs: Any) -> HFStreamingSource:
        options: dict[str, Any] = dict(dataset_name="web", seed=3, shuffle_buffer_size=32)
        options.update(kwargs)
        return HFStreamingSource(make_stream(), **options)

    return make


def row_id(sample: dict[str, Any]) -> int:
    text = bytes(sample["input_ids"].astype(np.uint8).tolist()).decode("utf-8")
    return int(text.split(":", 1)[0].removeprefix("row "))


def fingerprint(sample: dict[str, Any]) -> tuple:
    """Everything a sample carries, bitwise (dtype and bytes of the arrays)."""
    mask = sample.get("loss_mask")
    return (
        sample["source"],
        sample["epoch"],
        sample["input_ids"].dtype.str,
        sample["input_ids"].tobytes(),
        None if mask is None else (mask.dtype.str, mask.tobytes()),
    )


def take(iterable: Iterable[Any], count: int) -> list[Any]:
    return list(itertools.islice(iterable, count))


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    """What a checkpoint does to the state: save, then load with ``weights_only=True``."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def by_epoch(samples: list[dict[str, Any]]) -> dict[int, list[int]]:
    rows: dict[int, list[int]] = {}
    for sample in samples:
        rows.setdefault(sample["epoch"], []).append(row_id(sample))
    return rows


# -- passes and shuffling ------------------------------------------------------------------


def test_infinite_stream_visits_every_row_once_per_pass_in_a_new_order(make_source) -> None:
    samples = take(iter(make_source()), 3 * NUM_ROWS)

    passes = by_epoch(samples)
    assert sorted(passes) == [0, 1, 2]
    for rows in passes.values():
        assert sorted(rows) == list(range(NUM_ROWS))
    assert passes[0] != list(range(NUM_ROWS))  # shuffled, not file order
    assert passes[0] != passes[1] != passes[2] != passes[0]
    assert all(s["source"] == "web" and s["input_ids"].dtype == np.int64 for s in samples)
    assert all(s["loss_mask"].dtype == bool and s["loss_mask"].shape == s["input_ids"].shape for s in samples)


def test_unshuffled_stream_yields_rows_in_file_order_every_pass(make_source) -> None:
    samples = take(iter(make_source(shuffle=False)), 2 * NUM_ROWS)

    assert [row_id(s) for s in samples] == list(range(NUM_ROWS)) * 2
    assert [s["epoch"] for s in samples] == [0] * NUM_ROWS + [1] * NUM_ROWS


def test_shards_get_equal_rows_per_pass_and_the_remainder_is_dropped(make_source) -> None:
    world_size = 3  # 200 = 3 * 66 + 2: the last, incomplete group of 2 rows is dropped
    per_shard = NUM_ROWS // world_size
    seen: list[int] = []
    for rank in range(world_size):
        source = make_source(rank=rank, world_size=world_size, num_passes=1)
        rows = [row_id(s) for s in source]
        assert len(rows) == per_shard
        assert all(row % world_size == rank for row in rows)
        seen.extend(rows)

    assert sorted(seen) == list(range(per_shard * world_size))


def test_same_seed_gives_same_order_and_different_seed_a_different_one(make_source) -> None:
    first = [fingerprint(s) for s in take(iter(make_source(seed=11)), 2 * NUM_ROWS)]
    again = [fingerprint(s) for s in take(iter(make_source(seed=11)), 2 * NUM_ROWS)]
    other = [fingerprint(s) for s in take(iter(make_source(seed=12)), 2 * NUM_ROWS)]

    assert first == again
    assert first != other
    assert sorted(first) == sorted(other)  # same rows, different order


# -- resume from the source's own state ----------------------------------------------------


@pytest.mark.parametrize(
    ("options", "cuts"),
    [
        # buffer 32: full buffer mid-pass (5, 100), draining the end of pass 0 with a partly
        # filled buffer (190), exactly at the pass boundary (200), inside pass 1 (263)
        (dict(shuffle_buffer_size=32), [0, 5, 100, 190, 200, 263]),
        # the buffer is larger than a pass: it never fills and every sample comes from draining
        (dict(shuffle_buffer_size=500), [50, 199]),
        (dict(shuffle=False), [70, 200]),
    ],
)
def test_state_after_k_samples_resumes_bitwise_identically_in_a_fresh_source(make_source, options, cuts) -> None:
    continuation = 60
    reference = [fingerprint(s) for s in take(iter(make_source(**options)), max(cuts) + continuation)]

    for k in cuts:
        source = make_source(**options)
        iterator = iter(source)
        take(iterator, k)
        state = roundtrip(source.state_dict())
        resumed = make_source(**options)
        resumed.load_state_dict(state)

        tail = [fingerprint(s) for s in take(iter(resumed), continuation)]
        assert tail == reference[k : k + continuation], f"resume after {k} samples diverged"


def test_resume_is_exact_over_several_files_read_in_several_arrow_tables(tmp_path: Path) -> None:
    texts = row_texts()
    parts = (texts[:60], texts[60:130], texts[130:])
    files = [str(write_jsonl(tmp_path / f"part{i}.jsonl", part)) for i, part in enumerate(parts)]

    def make() -> HFStreamingSource:
        # chunksize in bytes: each file is parsed into several Arrow tables
        stream = datasets.load_dataset("json", data_files=files, split="train", streaming=True, chunksize=400)
        stream = stream.map(tokenize, remove_columns=["text"])
        return HFStreamingSource(stream, "web", seed=5, shuffle_buffer_size=16)

    continuation = 50
    reference = [fingerprint(s) for s in take(iter(make()), 300)]
    assert sorted(row_id(s) for s in take(iter(make()), NUM_ROWS)) == list(range(NUM_ROWS))
    for k in (37, 150, 230):
        source = make()
        take(iter(source), k)
        resumed = make()
        resumed.load_state_dict(roundtrip(source.state_dict()))
        assert [fingerprint(s) for s in take(iter(resumed), continuation)] == reference[k : k + continuation]


def test_a_pickled_source_continues_where_it_was(make_source) -> None:
    source = make_source()
    iterator = iter(source)
    take(iterator, 75)

    copy = pickle.loads(pickle.dumps(source))  # what spawned dataloader workers receive

    assert [fingerprint(s) for s in take(iter(copy), 60)] == [fingerprint(s) for s in take(iterator, 60)]


def test_state_holds_the_partly_filled_buffer_while_a_pass_drains(make_source) -> None:
    source = make_source(shuffle_buffer_size=32)
    take(iter(source), NUM_ROWS - 10)  # the stream ended 22 samples ago; 10 documents remain

    own = source.state_dict()["web"]

    assert own["stream_done"] is True
    assert len(own["buffer_lengths"]) == 10
    assert all(isinstance(token, int) for token in own["buffer_input_ids"])
    assert sum(own["buffer_lengths"]) == len(own["buffer_input_ids"]) == len(own["buffer_loss_mask"])
    assert json.loads(json.dumps(own["buffer_lengths"])) == own["buffer_lengths"]


def test_state_dict_is_fresh_and_loads_with_weights_only(make_source) -> None:
    source = make_source()
    iterator = iter(source)
    take(iterator, 40)
    state = source.state_dict()
    snapshot = roundtrip(state)
    take(iterator, 40)  # keep going; the returned state must not change underneath the caller

    own, saved = state["web"], snapshot["web"]
    assert own["position"] == saved["position"] and own["draws"] == saved["draws"]
    assert own["hf_state"] == saved["hf_state"]
    assert own["buffer_input_ids"] == saved["buffer_input_ids"]
    assert source.state_dict()["web"]["position"] > own["position"]


def test_resume_with_a_different_shard_count_or_buffer_is_refused(make_source) -> None:
    source = make_source(rank=0, world_size=2)
    take(iter(source), 10)
    state = source.state_dict()

    with pytest.raises(ValueError, match="shard 0 of 2"):
        make_source(rank=0, world_size=1).load_state_dict(state)
    with pytest.raises(ValueError, match="shuffle buffer of 32"):
        make_source(rank=0, world_size=2, shuffle_buffer_size=8).load_state_dict(state)
    with pytest.raises(KeyError, match="'other' not found"):
        make_source(dataset_name="other", rank=0, world_size=2).load_state_dict(state)


# -- dataloader workers and ranks ----------------------------------------------------------


def loader(source: HFStreamingSource) -> StatefulDataLoader:
    return StatefulDataLoader(source, num_workers=2, batch_size=4, collate_fn=lambda x: x)


def test_two_dataloader_workers_read_disjoint_rows(make_source) -> None:
    batches = take(loader(make_source()), 50)  # 2 workers x 25 batches x 4 = one pass each

    per_worker = [[row_id(s) for batch in batches[worker::2] for s in batch] for worker in (0, 1)]
    assert all(len(rows) == NUM_ROWS // 2 for rows in per_worker)
    assert not set(per_worker[0]) & set(per_worker[1])
    assert sorted(per_worker[0] + per_worker[1]) == list(range(NUM_ROWS))
    assert {s["epoch"] for batch in batches for s in batch} == {0}


def test_dataloader_state_after_n_batches_resumes_identically_in_a_new_loader(make_source) -> None:
    n, continuation = 30, 40  # each worker does 25 batches per pass: the continuation crosses it
    reference = [[fingerprint(s) for s in batch] for batch in take(loader(make_source()), n + continuation)]

    interrupted = loader(make_source())
    iterator = iter(interrupted)
    take(iterator, n)
    state = roundtrip(interrupted.state_dict())
    del iterator

    resumed = loader(make_source())
    resumed.load_state_dict(state)
    tail = [[fingerprint(s) for s in batch] for batch in take(resumed, continuation)]

    assert tail == reference[n:]
    assert {s[1] for batch in tail for s in batch} == {0, 1}  # really crossed a pass boundary


def test_two_ranks_with_two_workers_each_visit_every_row_once_per_pass(make_source) -> None:
    # 4 shards of 50 rows: 2 passes per worker are 25 batches of 4 per worker, 50 per rank.
    samples = [
        sample
        for rank in (0, 1)
        for batch in take(loader(make_source(rank=rank, world_size=2)), 50)
        for sample in batch
    ]

    passes = by_epoch(samples)
    assert sorted(passes) == [0, 1]
    for rows in passes.values():
        assert Counter(rows) == Counter(range(NUM_ROWS))


# -- bad data and configuration ------------------------------------------------------------


def test_overlong_documents_are_truncated_or_dropped_and_counted(make_source) -> None:
    truncating = make_source(max_seq_len=12, num_passes=1)
    truncated = list(truncating)
    dropping = make_source(max_seq_len=12, overlong="drop", num_passes=1)
    kept = list(dropping)

    assert len(truncated) == NUM_ROWS
    assert all(len(s["input_ids"]) <= 12 and len(s["loss_mask"]) == len(s["input_ids"]) for s in truncated)
    n_long = truncating.state_dict()["web"]["overlong_truncated"]
    assert 0 < n_long < NUM_ROWS
    assert len(kept) == NUM_ROWS - n_long == NUM_ROWS - dropping.state_dict()["web"]["overlong_dropped"]


def corrupt_rows_3_and_8(example: dict[str, Any]) -> dict[str, Any]:
    """Tokenise, but give rows 3 and 8 a loss mask of the wrong length."""
    out = tokenize(example)
    if example["text"].startswith(("row 3:", "row 8:")):
        out["loss_mask"] = out["loss_mask"][:-1]
    return out


def test_unreadable_rows_are_skipped_within_the_error_budget_then_raise(make_stream) -> None:
    tolerant = HFStreamingSource(make_stream(corrupt_rows_3_and_8), "web", max_error_count=2, num_passes=1)
    rows = sorted(row_id(s) for s in tolerant)

    assert rows == [i for i in range(NUM_ROWS) if i not in (3, 8)]
    assert tolerant.state_dict()["web"]["errors"] == 2

    strict = HFStreamingSource(make_stream(corrupt_rows_3_and_8), "web", max_error_count=1, num_passes=1)
    with pytest.raises(RuntimeError, match=r"(?s)max_error_count=1.*stream row 3.*loss_mask"):
        list(strict)


def fail_on_row_5(example: dict[str, Any]) -> dict[str, Any]:
    if example["text"].startswith("row 5:"):
        raise ValueError("tokenizer exploded")
    return tokenize(example)


def test_a_failure_inside_the_datasets_map_is_raised_with_source_pass_and_row(make_stream) -> None:
    source = HFStreamingSource(make_stream(fail_on_row_5), "web", shuffle=False, max_error_count=10)

    with pytest.raises(RuntimeError, match=r"'web'.*row 5 of pass 0.*tokenizer exploded"):
        list(itertools.islice(source, NUM_ROWS))


def test_datasets_shuffle_split_and_map_style_inputs_are_rejected(make_stream) -> None:
    with pytest.raises(ValueError, match="Remove the .shuffle"):
        HFStreamingSource(make_stream().shuffle(seed=0, buffer_size=10), "web")
    with pytest.raises(ValueError, match="split_dataset_by_node"):
        HFStreamingSource(split_dataset_by_node(make_stream(), rank=0, world_size=2), "web")
    in_memory = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]]})
    with pytest.raises(TypeError, match="ArrowSource"):
        HFStreamingSource(in_memory, "web")


def test_a_stream_with_fewer_rows_than_shards_fails_with_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "tiny.jsonl"
    path.write_text(json.dumps({"text": "row 0: alpha"}) + "\n", encoding="utf-8")
    stream = datasets.load_dataset("json", data_files=str(path), split="train", streaming=True).map(tokenize)

    with pytest.raises(RuntimeError, match="needs at least 2 rows"):
        next(iter(HFStreamingSource(stream, "tiny", rank=1, world_size=2)))


def test_resume_with_another_layout_is_refused_naming_the_way_out(make_source) -> None:
    from lightning_tune_data.sources.base import ElasticResumeUnsupported

    source = make_source(rank=0, world_size=2)
    take(iter(source), 5)
    with pytest.raises(ElasticResumeUnsupported, match="resume_data_state: false"):
        make_source().merge_shard_states([source.state_dict()])


# -- run-wide settings ---------------------------------------------------------------------


def test_settings_give_bitwise_the_same_samples_and_state_as_the_keywords(make_stream) -> None:
    options = dict(seed=3, rank=1, world_size=2, num_passes=2, max_seq_len=20, overlong="drop")
    by_keywords = HFStreamingSource(make_stream(), "web", shuffle_buffer_size=16, **options)
    by_settings = HFStreamingSource(make_stream(), "web", shuffle_buffer_size=16, settings=StreamSettings(**options))

    assert by_settings.settings == by_keywords.settings == StreamSettings(**options)
    assert [fingerprint(s) for s in by_settings] == [fingerprint(s) for s in by_keywords]
    assert by_settings.state_dict() == by_keywords.state_dict()
    assert (by_settings.seed, by_settings.num_passes, by_settings.max_seq_len, by_settings.overlong) == (3, 2, 20, "drop")
    assert (by_settings.shuffle_buffer_size, by_settings.max_retries, by_settings.retry_backoff_s) == (16, 3, 1.0)


def test_settings_are_checked_like_the_keywords_and_not_given_twice(make_stream) -> None:
    with pytest.raises(ValueError, match="Source 'web': seed must be >= 0, got -1"):
        HFStreamingSource(make_stream(), "web", settings=StreamSettings(seed=-1))
    with pytest.raises(ValueError, match="Source 'web': max_seq_len must be >= 1 or None, got 0"):
        HFStreamingSource(make_stream(), "web", settings=StreamSettings(max_seq_len=0))
    with pytest.raises(ValueError, match="Source 'web': num_passes given both"):
        HFStreamingSource(make_stream(), "web", num_passes=1, settings=StreamSettings(num_passes=1))
