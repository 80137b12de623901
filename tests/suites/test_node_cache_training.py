"""Training from a store in S3 through a bounded node cache, offline: moto's S3 server on 127.0.0.1,
real s3fs, real dataloader workers and a real Trainer.

The store (two sources in ~1 KB shards) is written to S3 once per test by ``prepare_data`` from a
writer node; each reader "node" is its own ``local_cache_dir``. A ``cache_budget`` below the
store's size makes the reader fetch shards on demand, window by window; the tests check the
budget, determinism, exact resume on a cold node, elastic resume, and the errors.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import BatchRecorder, make_texts, write_jsonl
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from lightning_tune_data import LocalDatasetManager, TextDataModule
from lightning_tune_data.cache.cached_store import _STORES, CachedStore
from lightning_tune_data.cache.owners import claimed, lock_holders
from lightning_tune_data.cache.window_plan import window_need
from lightning_tune_data.models import TinyCausalLM
from lightning_tune_data.sources.arrow import ArrowSource

pytestmark = pytest.mark.filterwarnings("ignore:Train source .* longer than max_seq_len")
ROWS = {"a": 240, "b": 160}


@pytest.fixture
def corpus(tmp_path) -> dict[str, str]:
    return {name: str(write_jsonl(tmp_path / f"{name}.jsonl", make_texts(rows, seed=len(name) + rows, prefix=name.upper(),
                                                                        min_words=4, max_words=24)))
            for name, rows in ROWS.items()}


def datamodule(corpus: dict[str, str], s3, node: Path | None, **options: Any) -> TextDataModule:
    """Sources ``a`` (weight 0.6) and ``b`` over the S3 store (``node``: this node's cache; ``None``:
    the same data in a local store instead)."""
    settings = dict(max_seq_len=48, batch_size=4, seed=3, shard_size="1KB", num_workers=0)
    settings.update(options)
    cache_dir = settings.pop("cache_dir", s3.url)
    managers = {name: LocalDatasetManager(data_files=[path], weight=weight)
                for (name, path), weight in zip(corpus.items(), (0.6, 0.4))}
    if node is None:
        return TextDataModule({"train": managers}, cache_dir=str(Path(corpus["a"]).parent / "local-cache"), **settings)
    return TextDataModule({"train": managers}, cache_dir=cache_dir, storage_options=s3.storage_options,
                          local_cache_dir=str(node), **settings)


def write_store(corpus, s3, tmp_path) -> dict[str, int]:
    """Write both sources' stores to S3; their sizes in bytes."""
    writer = datamodule(corpus, s3, tmp_path / "writer", build_stores="if_missing")
    writer.prepare_data()
    sizes = {}
    for name in ROWS:
        [commit] = [key for key in s3.keys() if key.startswith(f"{name}-") and key.endswith("_COMPLETE.json")]
        content = json.loads(s3.get(commit))
        sizes[name] = sum(entry["size"] for path, entry in content["files"].items() if path.startswith("shards/"))
    return sizes


def set_up(dm: TextDataModule) -> TextDataModule:
    dm.prepare_data()
    dm.setup("fit")
    return dm


def batches(dm: TextDataModule, count: int) -> list[dict[str, torch.Tensor]]:
    return [{k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)}
            for batch in itertools.islice(dm.train_dataloader(), count)]


def assert_same_batches(left: list[dict], right: list[dict]) -> None:
    assert len(left) == len(right)
    for step, (x, y) in enumerate(zip(left, right)):
        assert x.keys() == y.keys(), step
        for key in x:
            assert torch.equal(x[key], y[key]), f"batch {step}, {key}"


def prefetch_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("shard-prefetch")]


def shard_gets(s3) -> int:
    return sum(1 for method, path in s3.requests.log if method == "GET" and s3.prefix in path and "/shards/" in path)


# -- reading through a budget -------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_a_quarter_budget_reads_shard_by_shard_within_the_budget_and_gives_the_same_batches_on_every_node(
        corpus, s3, tmp_path):
    sizes = write_store(corpus, s3, tmp_path)
    budget = max(sizes.values()) // 4
    first = set_up(datamodule(corpus, s3, tmp_path / "node1", cache_budget=budget, num_workers=2, packing="best_fit"))
    store = first.dataset("train", "a")
    assert isinstance(store, CachedStore) and store.num_shards >= 16 and store.window >= 1
    assert not (tmp_path / "node1" / store.cache.files.name).exists()  # nothing was copied whole
    gets_before = shard_gets(s3)
    ours = batches(first, 150)
    fetched = shard_gets(s3) - gets_before
    for name in ROWS:
        cache = first.dataset("train", name).cache
        assert 0 < cache.node_usage() <= budget  # the node's budget, for both stores together
        # the loader's workers live on and may be fetching ahead: a download in flight is theirs
        # (they hold its lock); none may be left by a process that ended
        assert not [path for path in cache.folder.rglob("*.partial-*") if not claimed(path)]
    assert fetched > budget // max(entry["size"] for entry in store.shards)  # more than fits at once: evictions

    again = batches(set_up(datamodule(corpus, s3, tmp_path / "node2", cache_budget=budget, num_workers=2,
                                      packing="best_fit")), 150)
    assert_same_batches(ours, again)
    assert sum(int(b["attention_mask"].sum()) for b in ours) > 0


@pytest.mark.timeout(300)
def test_a_budget_that_holds_the_store_copies_it_whole_and_keeps_the_local_stores_full_shuffle(corpus, s3, tmp_path):
    sizes = write_store(corpus, s3, tmp_path)
    whole = set_up(datamodule(corpus, s3, tmp_path / "node", cache_budget=sum(sizes.values()) * 2))
    assert not isinstance(whole.dataset("train", "a"), CachedStore)
    assert_same_batches(batches(whole, 60), batches(set_up(datamodule(corpus, s3, None)), 60))


@pytest.mark.timeout(300)
def test_every_row_is_read_once_per_pass_and_an_elastic_resume_on_more_shards_reads_the_rest_once(
        corpus, s3, tmp_path):
    sizes = write_store(corpus, s3, tmp_path)
    store = set_up(datamodule(corpus, s3, tmp_path / "node", cache_budget=sizes["a"] // 4)).dataset("train", "a")
    old = [ArrowSource(store, "a", seed=3, rank=rank, world_size=2) for rank in range(2)]
    seen = []
    for source, count in zip(old, (37, 52)):  # the old layout's shards stopped at different places
        seen += [doc["source_row"] for doc in itertools.islice(iter(source), count)]
    merged = old[0].merge_shard_states([source.state_dict() for source in old])
    new = [ArrowSource(store, "a", seed=3, rank=rank, world_size=3, num_passes=1) for rank in range(3)]
    for source in new:
        source.load_global_state(merged)
        seen += [doc["source_row"] for doc in source]
    per_pass = ROWS["a"] - ROWS["a"] % 2  # the old layout's pass (n % 2 rows wait for the next pass)
    assert sorted(seen) == sorted(set(seen)) and len(seen) == per_pass


# -- resume -------------------------------------------------------------------------------------------
def fit(dm: TextDataModule, run_dir: Path, max_steps: int, ckpt_path: str | None = None) -> BatchRecorder:
    seed_everything(0)
    recorder = BatchRecorder()
    trainer = Trainer(accelerator="cpu", max_steps=max_steps, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=0, default_root_dir=run_dir,
                      callbacks=[recorder, ModelCheckpoint(dirpath=run_dir / "ckpt", every_n_train_steps=4,
                                                           save_top_k=-1)])
    model = TinyCausalLM(vocab_size=dm.vocab_size, max_seq_len=48, d_model=16, n_layers=1, n_heads=2)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return recorder


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_resume_on_a_cold_node_continues_with_exactly_the_uninterrupted_batches(corpus, s3, tmp_path):
    sizes = write_store(corpus, s3, tmp_path)
    options = dict(cache_budget=max(sizes.values()) // 4, num_workers=2, packing="best_fit")
    whole = fit(datamodule(corpus, s3, tmp_path / "node", **options), tmp_path / "whole", 12)
    shutil.rmtree(tmp_path / "node")  # the resumed run starts on a node with nothing cached
    [checkpoint] = (tmp_path / "whole" / "ckpt").glob("*step=4.ckpt")
    resumed = fit(datamodule(corpus, s3, tmp_path / "node", **options), tmp_path / "resumed", 12, str(checkpoint))
    assert resumed.steps == list(range(4, 12))
    assert_same_batches(whole.batches[4:], resumed.batches)


def resume(dm: TextDataModule, state: dict, count: int) -> list[dict[str, torch.Tensor]]:
    dm.load_state_dict(state)
    return batches(dm, count)


@pytest.mark.timeout(300)
def test_the_same_batches_under_a_budget_whether_one_two_or_four_tasks_wrote_the_store(corpus, s3, tmp_path):
    from lightning_tune_data import prepare_task

    one_source = {"a": corpus["a"]}
    runs, shard_counts = [], []
    for tasks in (1, 2, 4):
        cache_dir = f"{s3.url}/tasks{tasks}"
        writer = TextDataModule({"train": {"a": LocalDatasetManager(data_files=[corpus["a"]])}}, cache_dir=cache_dir,
                                storage_options=s3.storage_options, local_cache_dir=str(tmp_path / f"writer{tasks}"),
                                max_seq_len=48, shard_size="1KB")
        for index in range(tasks):
            prepare_task(writer, index, tasks)
        dm = set_up(datamodule(one_source, s3, tmp_path / f"node{tasks}", cache_dir=cache_dir, cache_budget="48KB",
                               packing="best_fit"))
        store = dm.dataset("train", "a")
        assert isinstance(store, CachedStore) and store.size > store.budget
        shard_counts.append(tuple(store.shard_rows.tolist()))
        runs.append((store.order, batches(dm, 40)))
    assert len(set(shard_counts)) > 1  # the stores are cut into shards differently
    assert runs[0][0] == runs[1][0] == runs[2][0]  # ... but read in one order
    assert_same_batches(runs[0][1], runs[1][1])
    assert_same_batches(runs[0][1], runs[2][1])


@pytest.mark.timeout(300)
def test_resume_on_a_node_with_a_larger_budget_or_none_continues_exactly_in_the_checkpoints_window(
        corpus, s3, tmp_path):
    sizes = write_store(corpus, s3, tmp_path)
    first = set_up(datamodule(corpus, s3, tmp_path / "small", cache_budget="40KB", packing="best_fit"))
    windows = {name: first.dataset("train", name).window for name in ROWS}
    whole = batches(first, 12)
    first = set_up(datamodule(corpus, s3, tmp_path / "small", cache_budget="40KB", packing="best_fit"))
    batches(first, 4)
    state = first.state_dict()
    larger = set_up(datamodule(corpus, s3, tmp_path / "large", cache_budget=sum(sizes.values()) // 2,
                               packing="best_fit"))
    assert all(larger.dataset("train", name).window > windows[name] for name in ROWS)  # its own would be larger
    assert_same_batches(resume(larger, state, 8), whole[4:])
    assert {name: larger.dataset("train", name).window for name in ROWS} == windows  # the checkpoint's
    unbudgeted = set_up(datamodule(corpus, s3, tmp_path / "whole", packing="best_fit"))  # stores copied whole
    assert_same_batches(resume(unbudgeted, state, 8), whole[4:])


@pytest.mark.timeout(300)
def test_a_smaller_budget_resumes_when_it_holds_the_window_and_is_refused_naming_the_size_when_it_cannot(
        corpus, s3, tmp_path):
    write_store(corpus, s3, tmp_path)
    first = set_up(datamodule(corpus, s3, tmp_path / "large", cache_budget="80KB", packing="best_fit"))
    whole = batches(first, 10)
    first = set_up(datamodule(corpus, s3, tmp_path / "large", cache_budget="80KB", packing="best_fit"))
    batches(first, 4)
    state = first.state_dict()
    stores = [first.dataset("train", name) for name in ROWS]
    need = max(window_need(store.shard_starts, store.shard_sizes, store.order) for store in stores)
    assert 2 * need < 80_000  # two train stores share the budget: each needs its window's shards
    smaller = set_up(datamodule(corpus, s3, tmp_path / "smaller", cache_budget=2 * need, packing="best_fit"))
    assert_same_batches(resume(smaller, state, 6), whole[4:])
    tiny = set_up(datamodule(corpus, s3, tmp_path / "tiny", cache_budget=need, packing="best_fit"))  # half of it each
    with pytest.raises(ValueError) as refused:
        resume(tiny, state, 1)
    message = str(refused.value)
    assert "cannot hold a shuffle window of" in message and "Raise cache_budget to at least" in message
    assert "resume_data_state: false" in message and "set shuffle_window" not in message and "\n" not in message


# -- errors -------------------------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_a_budget_too_small_for_a_window_and_its_prefetch_fails_in_setup_naming_the_fix(corpus, s3, tmp_path):
    write_store(corpus, s3, tmp_path)
    small = datamodule(corpus, s3, tmp_path / "node", cache_budget="1KB")
    with pytest.raises(ValueError, match=r"cache_budget 1.0 KB cannot hold a shuffle window of 1 rows .*Raise cache_budget "
                                         r"to at least .*, or prepare the store with a smaller shard_size"):
        set_up(small)
    explicit = datamodule(corpus, s3, tmp_path / "node", cache_budget="8KB", shuffle_window=50)
    with pytest.raises(ValueError, match="shuffle window of 50 rows .*Raise cache_budget to at least .*, or lower shuffle_window"):
        set_up(explicit)


def test_train_mode_map_refuses_a_store_read_shard_by_shard(corpus, s3, tmp_path):
    sizes = write_store(corpus, s3, tmp_path)
    dm = datamodule(corpus, s3, tmp_path / "node", cache_budget=max(sizes.values()) // 4)
    dm.dataset_managers["train"].pop("b")
    dm.train_mode = "map"
    set_up(dm)
    with pytest.raises(ValueError, match="train_mode 'map' needs the whole store on this node"):
        dm.train_dataloader()


def test_the_windowed_order_keeps_consecutive_documents_apart_within_a_window(corpus, s3, tmp_path):
    sizes = write_store(corpus, s3, tmp_path)
    store = set_up(datamodule(corpus, s3, tmp_path / "node", cache_budget=sizes["a"] // 2)).dataset("train", "a")
    rows = np.array([doc["source_row"] for doc in ArrowSource(store, "a", seed=3, num_passes=1)])
    shards = store.shard_of(rows)
    assert sorted(rows.tolist()) == list(range(len(rows)))
    assert np.mean(shards[1:] == shards[:-1]) < 0.6  # documents of a window's shards are interleaved


# -- two ranks of one node ----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_ddp_ranks_of_a_node_share_its_shard_cache_and_download_each_shard_at_most_once_per_window(corpus, s3, tmp_path):
    import os
    import subprocess
    import sys

    from conftest import S3_ENV

    sizes = write_store(corpus, s3, tmp_path)
    budget = max(sizes.values()) // 3
    managers = {name: {"class_path": "lightning_tune_data.LocalDatasetManager",
                       "init_args": {"data_files": [path], "weight": weight}}
                for (name, path), weight in zip(corpus.items(), (0.6, 0.4))}
    config = {"data": {"max_seq_len": 48, "batch_size": 4, "seed": 3, "shard_size": "1KB", "num_workers": 1,
                       "cache_dir": s3.url, "storage_options": s3.storage_options,
                       "local_cache_dir": str(tmp_path / "node"), "cache_budget": budget,
                       "dataset_managers": {"train": managers}}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    script = Path(__file__).resolve().parents[1] / "scripts" / "node_cache_ddp_fit.py"
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, **S3_ENV, "PYTHONPATH": str(repo)}
    before = {}
    for method, path in s3.requests.log:
        if method == "GET" and "/shards/" in path and s3.prefix in path:
            before[path] = before.get(path, 0) + 1
    steps = 20  # 2 ranks x 4 documents x 20 steps = 160: less than a pass of either source
    result = subprocess.run([sys.executable, str(script), str(tmp_path / "config.json"), str(tmp_path), str(steps)],
                            env=env, capture_output=True, text=True, timeout=380)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [rank["steps"] for rank in ranks] == [steps, steps]
    assert ranks[0]["caches"]["a"]["folder"] == ranks[1]["caches"]["a"]["folder"]  # one cache per node
    assert all(0 < cache["usage"] <= cache["budget"] for rank in ranks for cache in rank["caches"].values())
    gets: dict[str, int] = {}
    for method, path in s3.requests.log:
        if method == "GET" and "/shards/" in path and s3.prefix in path:
            gets[path] = gets.get(path, 0) + 1
    fetched = {path: count - before.get(path, 0) for path, count in gets.items() if count > before.get(path, 0)}
    # the ranks share every download (two ranks fetching for themselves would be 2x); a shard cut by
    # blocks' edges serves the windows of those blocks and may be fetched again for each: at most
    # about 1.5x the shards in all
    assert fetched and sum(fetched.values()) <= 1.5 * len(fetched), fetched


@pytest.mark.timeout(300)
def test_evicting_refetching_and_copying_out_held_documents_never_changes_a_batch(corpus, s3, tmp_path):
    sizes = write_store(corpus, s3, tmp_path)
    options = dict(shuffle_window=4, num_workers=0, packing="best_fit")
    roomy = set_up(datamodule(corpus, s3, tmp_path / "roomy", cache_budget=int(min(sizes.values()) * 0.9), **options))
    tight = set_up(datamodule(corpus, s3, tmp_path / "tight", cache_budget=min(sizes.values()) // 2, **options))
    assert all(isinstance(dm.dataset("train", name), CachedStore) and dm.dataset("train", name).window == 4
               for dm in (roomy, tight) for name in ROWS)  # the same order
    before = set(prefetch_threads())  # of datamodules of earlier tests not collected yet
    assert_same_batches(batches(roomy, 120), batches(tight, 120))
    assert set(prefetch_threads()) - before
    for dm in (roomy, tight):
        dm.teardown("fit")  # the end of a trial in a sweep, or of a notebook's run
    assert not set(prefetch_threads()) - before
    assert all(dm.dataset("train", name).pinned() == [] for dm in (roomy, tight) for name in ROWS)


@pytest.mark.timeout(300)
def test_between_batches_a_packer_holds_no_shard_outside_the_windows_it_reads(corpus, s3, tmp_path):
    """A dataloader worker waiting for its turn must hold only its windows' shards: the node's
    other readers are promised the rest of the budget, and wait for it otherwise."""
    sizes = write_store(corpus, s3, tmp_path)
    dm = set_up(datamodule(corpus, s3, tmp_path / "node", cache_budget=max(sizes.values()) // 4, packing="best_fit",
                           batch_size=16))
    stores = {name: dm.dataset("train", name) for name in ROWS}
    ever_pinned: dict[str, set[int]] = {name: set() for name in ROWS}
    most_pinned = dict.fromkeys(ROWS, 0)
    for _ in itertools.islice(dm.train_dataloader(), 200):  # a packer reads 2,048 documents at a time
        for name, store in stores.items():
            pinned = set().union(*(reader.pinned() for reader in list(_STORES) if reader.cache.folder == store.cache.folder))
            ever_pinned[name] |= pinned
            most_pinned[name] = max(most_pinned[name], len(pinned))
            held = {shard for shard in range(store.num_shards) if store.cache.path(shard).exists()
                    and os.getpid() in lock_holders(store.cache.path(shard))}
            assert held <= pinned, f"source {name}: shards {sorted(held - pinned)} held outside the windows read"
    assert all(len(ever_pinned[name]) > most_pinned[name] for name in ROWS), (ever_pinned, most_pinned)  # moved on


# -- watching the cache -------------------------------------------------------------------------------
class _RequestsAtLog(Callback):
    """How many requests the S3 server had answered when the metrics were last logged."""

    def __init__(self, s3) -> None:
        self.s3, self.count = s3, 0

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step % 4 == 0:
            self.count = len(self.s3.requests.log)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_the_cache_metrics_of_every_dataloader_worker_reach_metrics_csv_and_the_report(corpus, s3, tmp_path, caplog):
    import logging

    from lightning.pytorch.loggers import CSVLogger

    from lightning_tune_data import DatasetMetricsCallback
    from lightning_tune_data.report.write import read_metrics_csv, write_metrics_report

    sizes = write_store(corpus, s3, tmp_path)
    commits = {name: json.loads(s3.get(key)) for name in ROWS for key in s3.keys()
               if key.startswith(f"{name}-") and key.endswith("_COMPLETE.json")}
    shard_sizes = {f"{name}/{path}": entry["size"] for name, content in commits.items()
                   for path, entry in content["files"].items() if path.startswith("shards/")}
    before = len(s3.requests.log)
    dm = datamodule(corpus, s3, tmp_path / "node", cache_budget=max(sizes.values()) // 2, num_workers=2,
                    packing="best_fit")
    with caplog.at_level(logging.INFO, logger="lightning_tune_data.cache.store"):
        dm.prepare_data()
    plans = [record.getMessage() for record in caplog.records if "through the node's shard cache" in record.getMessage()]
    assert len(plans) == 2 and all("shuffle window of" in line and "downloads per pass at most" in line for line in plans)
    trainer = Trainer(accelerator="cpu", max_steps=8, logger=CSVLogger(tmp_path / "logs", name="run"), log_every_n_steps=4,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                      enable_checkpointing=False,
                      callbacks=[DatasetMetricsCallback(log_every_n_steps=4), requests_when_logged := _RequestsAtLog(s3)])
    trainer.fit(TinyCausalLM(vocab_size=dm.vocab_size, max_seq_len=48, d_model=16, n_layers=1, n_heads=2), datamodule=dm)
    [csv_path] = (tmp_path / "logs").rglob("metrics.csv")
    last: dict[str, float] = {}
    for row in read_metrics_csv(csv_path):
        last.update(row)

    def fetched(log: list) -> int:
        return sum(shard_sizes[f"{name}/{path.split(name + '-', 1)[1].split('/', 1)[1]}"]
                   for method, path in log[before:] if method == "GET" and "/shards/" in path
                   for name in ROWS if f"/{name}-" in path)

    # the workers read every shard, the main process none: what they counted by the last logged step
    # is what the server had sent then, less the downloads still in flight (two workers, each a
    # reader and a fetcher ahead); the workers go on fetching ahead after it
    logged = sum(last[f"cache/{name}/downloaded_bytes"] for name in ROWS)
    at_log = fetched(s3.requests.log[: requests_when_logged.count])
    assert at_log - 4 * max(shard_sizes.values()) <= logged <= fetched(s3.requests.log) and logged > 0
    assert all(last[f"cache/{name}/misses"] > 0 and f"cache/{name}/hits" in last for name in ROWS)
    assert all(f"cache/{name}/{metric}" in last for name in ROWS for metric in ("evictions", "wait_s", "over_budget"))
    markdown = write_metrics_report(csv_path, tmp_path / "report").read_text(encoding="utf-8")
    assert "## Node shard cache" in markdown and "| a | " in markdown and "| b | " in markdown
