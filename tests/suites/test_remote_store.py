"""Token stores in S3, offline: a real S3 API (moto's server on 127.0.0.1), real s3fs, real task
processes (the ``prepare`` CLI, a Slurm array's environment, torchrun) and a real Trainer.

Every test gets its own bucket and prefix (the ``s3`` fixture). The corpus has two train sources:
``a`` (four files: tasks split it by whole files) and ``b`` (one file: tasks split it by rows),
both preprocessed by ``remote_store_fns.tokenize_or_die`` (which can kill its own process).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from conftest import S3_ENV, make_texts, write_jsonl

from lightning_tune_data import finalize_stores, prepare_task
from lightning_tune_data.cache.mirror import StoreCorruptError
from lightning_tune_data.cache.root import StorageError
from lightning_tune_data.managers import CacheMissingError
from lightning_tune_data.cache.tasks import StoreNotCommittedError
from lightning_tune_data.commands.prepare import main as prepare_main
from lightning_tune_data.report.batches import datamodule_from_config

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "tests" / "scripts"
sys.path.insert(0, str(SCRIPTS))
from remote_store_fns import KILL_AT  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Train source .* longer than max_seq_len")
SOURCES = ("a", "b")
A_FILES, A_ROWS, B_ROWS = 4, 15, 37


# -- helpers ------------------------------------------------------------------------------------
def write_corpus(root: Path) -> dict[str, list[str]]:
    """Source ``a``: four files of 15 documents (``A<file>.<row>: ...``); ``b``: one file of 37."""
    a = [str(write_jsonl(root / "data" / f"a{f}.jsonl", make_texts(A_ROWS, seed=10 + f, prefix=f"A{f}.")))
         for f in range(A_FILES)]
    b = [str(write_jsonl(root / "data" / "b.jsonl", make_texts(B_ROWS, seed=20, prefix="B")))]
    return {"a": a, "b": b}


def config(files: dict[str, list[str]], cache_dir: str | Path, local_cache_dir: Path | None = None,
           storage_options: dict | None = None, **data: Any) -> dict:
    """A fit config's ``data:`` section over the corpus (``a`` weighted 0.6, ``b`` 0.4)."""
    managers = {
        name: {"class_path": "lightning_tune_data.LocalDatasetManager",
               "init_args": {"data_files": paths, "weight": weight,
                             "preprocess_function": "remote_store_fns.tokenize_or_die"}}
        for (name, paths), weight in zip(files.items(), (0.6, 0.4))
    }
    section = {"max_seq_len": 48, "batch_size": 4, "seed": 0, "cache_dir": str(cache_dir),
               "shard_size": "1KB", "dataset_managers": {"train": managers}, **data}
    if local_cache_dir is not None:
        section["local_cache_dir"] = str(local_cache_dir)
    if storage_options is not None:
        section["storage_options"] = storage_options
    return {"data": section}


def s3_config(s3, files: dict[str, list[str]], node: Path, **data: Any) -> dict:
    """The config of a node that may build a missing store itself (``build_stores`` if_missing,
    unless given): most tests here build the store with ``prepare_data`` on a writer node."""
    return config(files, s3.url, node, s3.storage_options, **{"build_stores": "if_missing", **data})


def write_yaml(path: Path, content: dict) -> str:
    path.write_text(yaml.safe_dump(content), encoding="utf-8")
    return str(path)


def cli_env(**extra: str) -> dict[str, str]:
    """This environment without a scheduler's task variables, plus the test S3 credentials and
    a PYTHONPATH that finds this checkout and ``tests/scripts``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in {"RANK", "WORLD_SIZE"}}
    return {**env, **S3_ENV, "PYTHONPATH": os.pathsep.join([str(REPO), str(SCRIPTS)]), **extra}


def start(args: list[str], **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], env=cli_env(**env), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def start_prepare(config_path: str, *args: str, **env: str) -> subprocess.Popen:
    return start(["-m", "lightning_tune_data", "prepare", "--config", config_path, *args], **env)


def finish(processes: list[subprocess.Popen], ok: bool = True) -> list[tuple[int, str, str]]:
    """Wait for every process; with ``ok``, each must have exited 0."""
    results = []
    for process in processes:
        out, err = process.communicate(timeout=300)
        results.append((process.returncode, out, err))
    if ok:
        for code, out, err in results:
            assert code == 0, f"exit {code}\n{out}\n{err[-4000:]}"
    return results


def store_name(s3, source: str) -> str:
    """The folder of ``source``'s store under the test prefix (exactly one must exist)."""
    names = {key.split("/", 1)[0] for key in s3.keys() if key.startswith(f"{source}-")}
    assert len(names) == 1, names
    return names.pop()


def commit_of(s3, source: str) -> dict:
    return json.loads(s3.get(f"{store_name(s3, source)}/_COMPLETE.json"))


def rows(datamodule) -> dict[str, list[list[int]]]:
    """Every train source's stored ``input_ids``, in row order (after ``setup``)."""
    return {name: [list(ids) for ids in datamodule.dataset("train", name)["input_ids"]] for name in SOURCES}


def set_up(content: dict):
    datamodule = datamodule_from_config(content)
    datamodule.prepare_data()
    datamodule.setup("fit")
    return datamodule


def one_task_store(tmp_path: Path, files: dict[str, list[str]], **data: Any):
    """The reference: a local store of the same sources written by one task (``prepare_data``)."""
    return set_up(config(files, tmp_path / "one_task_cache", **data))


def first_batches(datamodule, count: int) -> list[dict[str, torch.Tensor]]:
    loader = datamodule.train_dataloader()
    return [{k: v.clone() for k, v in batch.items() if isinstance(v, torch.Tensor)}
            for batch in itertools.islice(loader, count)]


def assert_same_batches(left: list[dict], right: list[dict]) -> None:
    assert len(left) == len(right)
    for step, (x, y) in enumerate(zip(left, right)):
        assert x.keys() == y.keys(), step
        for key in x:
            assert x[key].dtype == y[key].dtype and torch.equal(x[key], y[key]), f"batch {step}, {key}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def committed_copies(folder: Path) -> list[Path]:
    return sorted(folder.rglob("_COMPLETE.json")) if folder.exists() else []


# -- writing a store with tasks -------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_four_task_processes_write_one_s3_store_equal_to_a_one_task_store_row_for_row_and_batch_for_batch(s3, tmp_path):
    files = write_corpus(tmp_path)
    path = write_yaml(tmp_path / "s3.yaml", s3_config(s3, files, tmp_path / "writer"))
    results = finish([start_prepare(path, "--task-index", str(i), "--num-tasks", "4") for i in range(4)])

    lines = [line for _, out, _ in results for line in out.splitlines()]
    for source in SOURCES:
        written = [line for line in lines if f": train/{source}: written" in line]
        assert len(written) == 4 and any(", store committed at s3://" in line for line in written), lines
        commit = commit_of(s3, source)
        assert commit["store"]["num_tasks"] == 4
        assert {shard["path"].split("/")[1] for shard in commit["store"]["shards"]} == {
            f"task-{i:05d}-of-00004" for i in range(4)}
    assert commit_of(s3, "a")["store"]["rows"] == A_FILES * A_ROWS and commit_of(s3, "b")["store"]["rows"] == B_ROWS

    reference = one_task_store(tmp_path, files)
    from_s3 = set_up(s3_config(s3, files, tmp_path / "reader"))
    assert rows(from_s3) == rows(reference)
    assert len(rows(from_s3)["a"]) == A_FILES * A_ROWS

    for packing in ("best_fit", None):
        ours = first_batches(set_up(s3_config(s3, files, tmp_path / "reader", packing=packing)), 100)
        theirs = first_batches(one_task_store(tmp_path, files, packing=packing), 100)
        assert_same_batches(ours, theirs)
        assert len(ours) == 100 and sum(int(b["attention_mask"].sum()) for b in ours) > 0


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_killed_task_leaves_no_done_marker_and_rerunning_only_it_commits_the_uninterrupted_store(s3, tmp_path):
    files = write_corpus(tmp_path)
    content = s3_config(s3, files, tmp_path / "writer")
    for index in (0, 1, 3):
        assert "written" in prepare_task(content, index, 4)["train/a"]
    # task 2 reads file a2 (whole files per task) and is SIGKILLed while it tokenizes row 7 of it
    [(code, _, err)] = finish([start_prepare(write_yaml(tmp_path / "s3.yaml", content), "--task-index", "2",
                                             "--num-tasks", "4", **{KILL_AT: "A2.7:"})], ok=False)
    assert code == -signal.SIGKILL, err[-3000:]
    store_a = store_name(s3, "a")
    keys = s3.keys()
    assert f"{store_a}/tasks/task-00001-of-00004.done" in keys
    assert f"{store_a}/tasks/task-00002-of-00004.done" not in keys
    assert not [k for k in keys if k.endswith("_COMPLETE.json")]
    leftovers = sorted((tmp_path / "writer").glob(f".{store_a}.task-2-of-4.tmp-*"))
    assert leftovers, "the killed task's local staging folder"

    reader = s3_config(s3, files, tmp_path / "reader")
    with pytest.raises(StoreNotCommittedError, match=r"task 2 of 4 has not finished") as refused:
        datamodule_from_config(reader).setup("fit")
    assert "--task-index" in str(refused.value) and "--num-tasks 4" in str(refused.value)
    assert not committed_copies(tmp_path / "reader")

    assert prepare_task(content, 0, 4) == {"train/a": "already done", "train/b": "already done"}
    rerun = prepare_task(content, 2, 4)
    assert all(status.startswith("written") and ", store committed at " in status for status in rerun.values()), rerun
    assert prepare_task(content, 3, 4) == {"train/a": "store committed before", "train/b": "store committed before"}
    assert not [p for p in leftovers if p.exists()], "the rerun removes the killed run's staging folder"

    assert rows(set_up(reader)) == rows(one_task_store(tmp_path, files))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_racing_finalizers_both_succeed_and_leave_exactly_the_one_deterministic_commit(s3, tmp_path):
    files = write_corpus(tmp_path)
    content = s3_config(s3, files, tmp_path / "writer")
    prepare_task(content, 0, 2)
    assert ", store committed at s3://" in prepare_task(content, 1, 2)["train/a"]
    keys_before = s3.keys()
    commits = {source: s3.get(f"{store_name(s3, source)}/_COMPLETE.json") for source in SOURCES}
    for source in SOURCES:
        s3.delete(f"{store_name(s3, source)}/_COMPLETE.json")

    path = write_yaml(tmp_path / "s3.yaml", content)
    results = finish([start_prepare(path, "--finalize") for _ in range(2)])
    for _, out, _ in results:
        assert {line.split(": ")[0] for line in out.splitlines()} == {"train/a", "train/b"}, out
    assert s3.keys() == keys_before  # one commit object per store, and nothing else new
    for source in SOURCES:
        assert s3.get(f"{store_name(s3, source)}/_COMPLETE.json") == commits[source]
    assert finalize_stores(content) == {"train/a": "committed before", "train/b": "committed before"}


def test_a_reader_finding_every_task_finished_commits_the_same_bytes_a_finalizer_writes(s3, tmp_path):
    files = write_corpus(tmp_path)
    content = s3_config(s3, files, tmp_path / "writer")
    prepare_task(content, 0, 2)
    prepare_task(content, 1, 2)  # the last task commits the store
    commits = {source: s3.get(f"{store_name(s3, source)}/_COMPLETE.json") for source in SOURCES}
    for source in SOURCES:
        s3.delete(f"{store_name(s3, source)}/_COMPLETE.json")
    reader = datamodule_from_config(s3_config(s3, files, tmp_path / "reader"))
    reader.setup("fit")  # setup alone (no prepare_data) finds the tasks done, commits and downloads the store
    for source in SOURCES:
        assert s3.get(f"{store_name(s3, source)}/_COMPLETE.json") == commits[source]
        assert json.loads(commits[source])["inputs"]["source_name"] == source
    assert len(rows(reader)["a"]) == A_FILES * A_ROWS


# -- reading a store -----------------------------------------------------------------------------
def test_setup_and_prepare_data_refuse_an_uncommitted_store_naming_the_missing_task_and_the_fix(s3, tmp_path):
    files = write_corpus(tmp_path)
    prepare_task(s3_config(s3, files, tmp_path / "writer"), 0, 2)
    reader = datamodule_from_config(s3_config(s3, files, tmp_path / "reader"))
    with pytest.raises(StoreNotCommittedError) as refused:
        reader.setup("fit")
    message = str(refused.value)
    assert "source 'a'" in message and f"{s3.url}/{store_name(s3, 'a')}" in message
    assert "task 1 of 2 has not finished" in message
    assert "--task-index I --num-tasks 2" in message and "cache clean" in message
    with pytest.raises(StoreNotCommittedError, match="task 1 of 2"):
        reader.prepare_data()  # does not build a second store beside the one being written
    assert not committed_copies(tmp_path / "reader")
    assert not [k for k in s3.keys() if k.endswith("_COMPLETE.json")]


def test_a_shard_corrupted_in_s3_fails_a_fresh_node_naming_its_url_and_leaves_no_trusted_copy(s3, tmp_path):
    files = write_corpus(tmp_path)
    built = set_up(s3_config(s3, files, tmp_path / "builder"))  # builds here, uploads, commits
    shard = f"{store_name(s3, 'b')}/{commit_of(s3, 'b')['store']['shards'][0]['path']}"
    original = s3.get(shard)
    damaged = bytearray(original)
    damaged[len(damaged) // 2] ^= 0x01
    s3.put(shard, bytes(damaged))
    fresh = datamodule_from_config(s3_config(s3, files, tmp_path / "fresh"))
    gets = s3.requests.gets(f"/{s3.bucket}/{s3.prefix}/{shard}")

    with pytest.raises(StoreCorruptError) as corrupt:
        fresh.prepare_data()
    assert f"{s3.url}/{shard} is corrupt" in str(corrupt.value)
    assert s3.requests.gets(f"/{s3.bucket}/{s3.prefix}/{shard}") == gets + 2  # fetched once more, then named
    assert not [p for p in (tmp_path / "fresh").glob("*b-*") if p.is_dir()], "no copy of the corrupt store"
    with pytest.raises(StoreCorruptError, match="is corrupt"):
        fresh.setup("fit")
    assert not [p for p in (tmp_path / "fresh").glob("*b-*") if p.is_dir()]

    s3.put(shard, original)  # repaired in storage: the same node now downloads it
    assert rows(set_up(s3_config(s3, files, tmp_path / "fresh"))) == rows(built)


def test_a_fresh_node_fetches_each_stores_commit_once_for_a_whole_store_download(s3, tmp_path):
    files = write_corpus(tmp_path)
    set_up(s3_config(s3, files, tmp_path / "builder"))
    commits = [f"/{s3.bucket}/{s3.prefix}/{store_name(s3, source)}/_COMPLETE.json" for source in SOURCES]
    start_at = len(s3.requests.log)
    datamodule_from_config(s3_config(s3, files, tmp_path / "fresh")).prepare_data()
    served = s3.requests.log[start_at:]
    assert [sum(1 for _, path in served if path.startswith(commit)) for commit in commits] == [2, 2], served  # HEAD + GET
    assert [sum(1 for method, path in served if method == "GET" and path.startswith(commit)) for commit in commits] == [1, 1]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_two_nodes_train_identical_batches_from_one_s3_store_downloaded_once_per_node(s3, tmp_path):
    files = write_corpus(tmp_path)
    set_up(s3_config(s3, files, tmp_path / "builder"))
    shards = [f"{store_name(s3, source)}/{shard['path']}" for source in SOURCES
              for shard in commit_of(s3, source)["store"]["shards"]]

    def shard_gets() -> list[int]:
        return [s3.requests.gets(f"/{s3.bucket}/{s3.prefix}/{shard}") for shard in shards]

    before = shard_gets()
    processes = []
    for node in (0, 1):
        node_config = tmp_path / f"node{node}.json"
        node_config.write_text(json.dumps(s3_config(s3, files, tmp_path / f"node{node}")))
        processes.append(start([str(SCRIPTS / "remote_node_fit.py"), str(node_config), str(tmp_path / f"node{node}.pt")]))
    finish(processes)
    runs = [torch.load(tmp_path / f"node{node}.pt") for node in (0, 1)]
    assert [run["steps"] for run in runs] == [3, 3]
    assert_same_batches(runs[0]["batches"], runs[1]["batches"])
    assert [after - b for after, b in zip(shard_gets(), before)] == [2] * len(shards)  # once per node

    copies = [{str(p.relative_to(tmp_path / f"node{node}")): p.read_bytes()
               for source in SOURCES for p in (tmp_path / f"node{node}" / store_name(s3, source)).rglob("*")
               if p.is_file() and p.name != "_VERIFIED.json"} for node in (0, 1)]
    assert copies[0] == copies[1] and any(name.endswith(".arrow") for name in copies[0])

    node0 = tmp_path / "node0"
    stamps = {p: (p.stat().st_mtime_ns, p.stat().st_ino) for source in SOURCES
              for p in (node0 / store_name(s3, source)).rglob("*") if p.is_file() and p.name != "_VERIFIED.json"}
    again = set_up(s3_config(s3, files, node0))  # a second run on node 0
    assert shard_gets() == [b + 2 for b in before]
    assert {p: (p.stat().st_mtime_ns, p.stat().st_ino) for p in stamps} == stamps
    assert len(rows(again)["b"]) == B_ROWS


# -- errors --------------------------------------------------------------------------------------
def test_an_unreachable_endpoint_fails_prepare_data_with_one_line_naming_the_url(tmp_path, monkeypatch):
    for name, value in S3_ENV.items():
        monkeypatch.setenv(name, value)
    files = write_corpus(tmp_path)
    port = free_port()  # closed again: nothing listens there
    datamodule = datamodule_from_config(config(
        files, "s3://unreachable-bucket/prefix", tmp_path / "node",
        {"endpoint_url": f"http://127.0.0.1:{port}", "key": "testing", "secret": "testing",
         # botocore's own retries (about 13 s of waiting) are the client's business, not what this checks
         "config_kwargs": {"retries": {"max_attempts": 1}}}))
    with pytest.raises(StorageError) as failed:
        datamodule.prepare_data()
    message = str(failed.value)
    assert "\n" not in message and len(message) < 600, message
    assert message.startswith("cache_dir s3://unreachable-bucket/prefix: cannot use s3://unreachable-bucket/prefix/")
    assert f"127.0.0.1:{port}" in message and "endpoint_url" in message
    assert "Traceback" not in message and "botocore" not in message


@pytest.mark.parametrize("build_stores", ["auto", "if_missing"])
def test_a_missing_bucket_fails_prepare_data_with_one_line_naming_the_url_before_any_work(s3, tmp_path, build_stores):
    files = write_corpus(tmp_path)
    url = f"s3://{s3.bucket}-missing/prefix"  # the test server is up; this bucket was never created
    datamodule = datamodule_from_config(config(files, url, tmp_path / "node", s3.storage_options,
                                               build_stores=build_stores))
    with pytest.raises(StorageError) as failed:
        datamodule.prepare_data()
    message = str(failed.value)
    assert "\n" not in message and message.startswith(f"cache_dir {url}: the bucket (or container) "
                                                      f"'{s3.bucket}-missing' does not exist; create it first")
    assert not (tmp_path / "node").exists() or not any((tmp_path / "node").iterdir())  # nothing tokenized


def test_a_missing_store_under_a_remote_root_is_not_built_by_default_and_prepare_is_named(s3, tmp_path):
    files = write_corpus(tmp_path)
    datamodule = datamodule_from_config(config(files, f"{s3.url}/typo", tmp_path / "node", s3.storage_options))
    with pytest.raises(CacheMissingError) as missing:
        datamodule.prepare_data()
    message = str(missing.value)
    assert "\n" not in message and message.startswith(f"source 'a' (") and f"no committed store at {s3.url}/typo/a-" in message
    assert "build_stores=auto (a remote cache_dir) does not build it here" in message
    assert "Run lightning-tune-data prepare --config <config> with this cache_dir first" in message
    assert not (tmp_path / "node").exists() or not any((tmp_path / "node").iterdir())  # nothing tokenized
    assert not [key for key in s3.keys() if key.startswith("typo/")]  # and nothing written


def test_prepare_checks_the_bucket_before_tokenizing_anything(s3, tmp_path):
    files = write_corpus(tmp_path)
    content = config(files, f"s3://{s3.bucket}-missing/x", tmp_path / "node", s3.storage_options)
    with pytest.raises(StorageError, match=r"the bucket \(or container\) .* does not exist"):
        prepare_task(content, 0, 2)
    assert not (tmp_path / "node").exists() or not any((tmp_path / "node").iterdir())


def test_a_task_count_other_than_the_partly_written_stores_fails_naming_both_counts_and_the_fix(s3, tmp_path, capsys):
    files = write_corpus(tmp_path)
    content = s3_config(s3, files, tmp_path / "writer")
    prepare_task(content, 0, 2)
    with pytest.raises(StoreNotCommittedError) as refused:
        prepare_task(content, 1, 3)
    message = str(refused.value)
    assert "being written by 2 tasks (1 finished), not 3" in message
    assert "--num-tasks 2" in message and "cache clean" in message

    path = write_yaml(tmp_path / "s3.yaml", content)
    capsys.readouterr()
    assert prepare_main(["--config", path, "--task-index", "1", "--num-tasks", "3"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not 3" in err and "--num-tasks 2" in err
    assert not [k for k in s3.keys() if "-of-00003" in k], "nothing written for 3 tasks"


# -- schedulers ----------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_torchrun_ranks_write_and_commit_a_store_identical_to_the_one_task_store(tmp_path):
    files = write_corpus(tmp_path)
    cache = tmp_path / "torchrun_cache"
    path = write_yaml(tmp_path / "local.yaml", config(files, cache))
    [(_, out, _)] = finish([start(["-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
                                   "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0",
                                   "-m", "lightning_tune_data", "prepare", "--config", path])])
    assert "task 0 of 2: train/a: written" in out and "task 1 of 2: train/a: written" in out, out
    for source in SOURCES:
        [store] = list(cache.glob(f"{source}-*"))
        assert json.loads((store / "_COMPLETE.json").read_text())["store"]["num_tasks"] == 2
    assert rows(set_up(config(files, cache))) == rows(one_task_store(tmp_path, files))


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_slurm_array_starting_at_1_runs_tasks_0_and_1_of_2_and_commits_the_store(s3, tmp_path):
    files = write_corpus(tmp_path)
    path = write_yaml(tmp_path / "s3.yaml", s3_config(s3, files, tmp_path / "writer"))
    array = {"SLURM_ARRAY_TASK_MIN": "1", "SLURM_ARRAY_TASK_MAX": "2", "SLURM_ARRAY_TASK_COUNT": "2"}
    results = finish([start_prepare(path, SLURM_ARRAY_TASK_ID=str(task), **array) for task in (1, 2)])
    assert "task 0 of 2: train/a: written" in results[0][1] and "task 1 of 2: train/a: written" in results[1][1]
    for source in SOURCES:
        assert commit_of(s3, source)["store"]["num_tasks"] == 2
    assert rows(set_up(s3_config(s3, files, tmp_path / "reader"))) == rows(one_task_store(tmp_path, files))
