"""Benchmark 2: resume latency, from restoring a train data state to the first batch.

What is timed: the real resume path of a Lightning run, ``TextDataModule.load_state_dict(checkpoint
data state)`` then ``train_dataloader()`` (which builds the ``ResumableLoader`` and calls
``ResumableLoader.restore`` -> ``StatefulDataLoader.load_state_dict``) then ``next(iter(loader))``,
i.e. everything between "the checkpoint is loaded" and "the first batch is in the main process",
worker start-up included. Baseline of the step-10 figure: the same path with no state (a fresh
start); baseline of the step-1M figure: the step-10 figure (target: within 2x, and under 1 s).

How the step-1M state is built without iterating 1M batches. The loader state holds positions only
(per source and shard: pass and positions visited; per interleaver: draws and what each source
contributed; per packer: its open packs by reference), so it is *computed*: a genuine state is
taken after 10 batches (it has the exact structure: torchdata snapshot, worker snapshots, shard
ids, open packs), then every field that depends on the step is rewritten for step ``N``:

* with ``W`` workers (round robin, ``in_order``), worker ``w`` produced ``N // W + (w < N % W)``
  batches, i.e. ``s_w = batches * batch_size`` samples;
* unpacked single source: ``epoch, positions visited = divmod(s_w, rows_per_shard)`` (exact);
* interleaved: ``draws = s_w`` and each source's count is its expected share ``draws * weight``
  (the interleaver keeps every source within a few documents of that, so the state has the
  magnitudes of step ``N``), then ``divmod`` as above;
* packed (best_fit): the number of documents the packer consumed by step ``N`` is extrapolated
  from the genuine step-10 state (documents per batch); the open packs are the genuine ones (by
  reference: the same size as at any step);
* torchdata's counters (``_num_yielded``, ``_snapshot_step``, ``_sampler_iter_yielded``,
  ``samples_yielded``) are set to ``N`` (and ``N * batch_size``).

Resuming re-reads only the documents of the open packs and evaluates the pass permutation at the
saved position, so the cost cannot depend on ``N``; the run checks that for every configuration.
The unpacked single-source construction is validated in every run against the genuine state after
``VALIDATE_STEP`` batches.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from common import Result, log, make_datamodule, median, now

from lightning_tune_data.mixing.interleave import InterleavedDataset

CONFIGS = [
    ("unpacked", False, None, 16),
    ("interleaved", True, None, 16),
    ("interleaved+best_fit", True, "best_fit", 8),
]
STEP_SMALL = 10
STEP_BIG = 1_000_000
VALIDATE_STEP = 37


# ----------------------------------------------------------------------------- state surgery
def _walk(node: Any, fn) -> None:
    if isinstance(node, dict):
        fn(node)
        for value in node.values():
            _walk(value, fn)
    elif isinstance(node, list):
        for value in node:
            _walk(value, fn)


def _source_fields(count: int, rows_per_shard: int) -> tuple[int, int]:
    """(epoch, position) of an ArrowSource shard after yielding ``count`` samples."""
    if count > 0 and count % rows_per_shard == 0:
        return count // rows_per_shard - 1, rows_per_shard
    return divmod(count, rows_per_shard)


def _child_counts(interleaver, draws: int) -> dict[str, int]:
    """Expected samples of each child of ``interleaver`` after ``draws`` draws (its weights' shares)."""
    weights = interleaver.weights
    expected = np.floor(np.asarray(list(weights.values())) * draws).astype(np.int64)
    expected[0] += draws - int(expected.sum())
    return dict(zip(weights, expected.tolist()))


def _worker_dataset_states(state: dict, num_workers: int) -> list[tuple[int, dict]]:
    """[(worker id, dataset_state dict)] inside a ``ResumableLoader`` state.

    Without workers the state holds the stream's own ``state_dict`` (``"dataset"``); with workers,
    the ``StatefulDataLoader`` state with one snapshot per worker (``"loader"``).
    """
    if "dataset" in state:
        return [(0, state["dataset"])]
    loader_state = state["loader"]
    if num_workers == 0:
        return [(0, loader_state["dataset_state"])]
    snapshots = loader_state["_snapshot"]["_worker_snapshots"]
    return [(int(s["worker_id"]), s["dataset_state"]) for s in snapshots.values()]


def advance_state(dm, state: dict, step: int, batch_size: int, from_step: int) -> dict:
    """A loader state (``ResumableLoader.state_after`` format) for ``step``, computed from a genuine one."""
    state = copy.deepcopy(state)
    stream = dm.build_train_stream()
    packer = stream if dm.packing is not None else None
    inner = stream.dataset if packer is not None else stream
    interleaver = inner if isinstance(inner, InterleavedDataset) else None
    workers = dm.num_workers

    for worker, dataset_state in _worker_dataset_states(state, workers):
        batches = step // max(workers, 1) + (1 if workers and worker < step % workers else 0)
        samples = batches * batch_size
        if packer is not None:
            packed = dataset_state[packer.dataset_name]
            old_batches = from_step // max(workers, 1) + (1 if workers and worker < from_step % workers else 0)
            docs_per_batch = packed["counters"]["documents"] / max(old_batches, 1)
            packed["counters"]["packs"] = samples
            documents = int(round(docs_per_batch * batches))
            packed["counters"]["documents"] = documents
            child_state, draws = packed["child"], documents
        else:
            child_state, draws = dataset_state, samples
        if interleaver is not None:
            own = child_state[interleaver.dataset_name]
            old_draws = max(int(own["draws"]), 1)
            tokens_per_draw = sum(c["tokens"] for c in own["consumed"].values()) / old_draws
            own["draws"] = draws
            counts = _child_counts(interleaver, draws)
            own["consumed"] = {n: {"documents": c, "tokens": c * tokens_per_draw} for n, c in counts.items()}
            children = own["children"]
        else:
            counts = {inner.dataset_name: draws}
            children = child_state
        for name, count in counts.items():
            walk = children[name]["walk"]
            rows_per_shard = walk["num_rows"] // walk["num_shards"]
            walk["plan"]["epoch"], walk["plan"]["tail_taken"] = _source_fields(count, rows_per_shard)

    def counters(node: dict) -> None:
        for key in ("_num_yielded", "_snapshot_step", "_sampler_iter_yielded"):
            if key in node and isinstance(node[key], int):
                node[key] = step
        if "samples_yielded" in node:
            node["samples_yielded"] = step * batch_size

    if "loader" in state:
        _walk(state["loader"], counters)
    return state


def _positions(state: dict, num_workers: int) -> list:
    """(worker, shard, pass, positions visited) of every source, and draws, for comparing two states."""
    out = []
    for worker, dataset_state in _worker_dataset_states(state, num_workers):
        def grab(node: dict, worker=worker) -> None:
            if "plan" in node and "num_rows" in node:
                out.append((worker, "source", node["shard_id"], node["plan"]["epoch"], node["plan"]["tail_taken"]))
            if "draws" in node:
                out.append((worker, "draws", node["draws"]))
        _walk(dataset_state, grab)
    return sorted(out)


def checkpoint(dm, loader_state: dict | None, batches: int) -> dict:
    if loader_state is None:
        return {}
    from lightning_tune_data.loading.checkpoint import STATE_VERSION

    return {"version": STATE_VERSION, "signature": dm.data_signature(),
            "ranks": [{"batches_consumed": batches, "loader": loader_state}]}


def time_to_first_batch(dm, ckpt: dict) -> float:
    """Seconds from loading the data state to the first batch in the main process."""
    dm._resume.pending = None
    start = now()
    dm.load_state_dict(ckpt)
    loader = dm.train_dataloader()
    it = iter(loader)
    next(it)
    elapsed = now() - start
    del it, loader
    dm._train_loader = None
    return elapsed


# ----------------------------------------------------------------------------- driver
def run(ctx) -> list[Result]:
    results: list[Result] = []
    for name, interleaved, packing, bs in CONFIGS:
        for nw in ctx.worker_counts:
            dm = make_datamodule(ctx.token_parquet, ctx.cache_dir, interleaved, packing, nw, bs)
            # genuine states after STEP_SMALL and VALIDATE_STEP batches (one fresh loader)
            loader = dm.train_dataloader()
            it = iter(loader)
            for _ in range(STEP_SMALL):
                next(it)
            genuine_small = loader.state_after(STEP_SMALL)
            for _ in range(VALIDATE_STEP - STEP_SMALL):
                next(it)
            genuine_validate = loader.state_after(VALIDATE_STEP)
            del it, loader
            validation = ""
            if not interleaved and packing is None:
                computed = advance_state(dm, genuine_small, VALIDATE_STEP, bs, STEP_SMALL)
                same = _positions(computed, nw) == _positions(genuine_validate, nw)
                validation = f"computed state == genuine state at step {VALIDATE_STEP}: {same}"
                if not same:
                    log(f"resume: WARNING {name} workers {nw}: {validation}")
            t0 = now()
            big = advance_state(dm, genuine_small, STEP_BIG, bs, STEP_SMALL)
            build_s = now() - t0
            ckpts = {"fresh": {}, "small": checkpoint(dm, genuine_small, STEP_SMALL),
                     "big": checkpoint(dm, big, STEP_BIG)}
            times: dict[str, list[float]] = {k: [] for k in ckpts}
            time_to_first_batch(dm, ckpts["big"])  # warm the page cache / imports once
            for rep in range(ctx.resume_repeats):
                for key, ckpt in ckpts.items():
                    times[key].append(time_to_first_batch(dm, ckpt))
            log(f"resume: {name} workers {nw}: " + ", ".join(f"{k} {median(v):.3f}s" for k, v in times.items()))
            config = f"{name}, bs {bs}, workers {nw}"
            fresh, small, bigt = (median(times[k]) for k in ("fresh", "small", "big"))
            results.append(Result("2 resume", config, f"step {STEP_SMALL} -> first batch", small, "s",
                                  "fresh start -> first batch", fresh, repeats=times["small"]))
            results.append(Result("2 resume", config, f"step {STEP_BIG:,} -> first batch", bigt, "s",
                                  f"step {STEP_SMALL} resume", small, "<= 2x step 10 and < 1 s",
                                  bigt <= 2 * small and bigt < 1.0, repeats=times["big"],
                                  note=f"state computed in {build_s:.2f}s; {validation}".strip("; ")))
    return results
