"""Benchmark 2: resume latency, from restoring a train data state to the first batch.

What is timed: the real resume path of a Lightning run, ``TextDataModule.load_state_dict(checkpoint
data state)`` then ``train_dataloader()`` (which builds the ``ResumableLoader`` and calls
``ResumableLoader.restore`` -> ``StatefulDataLoader.load_state_dict``) then ``next(iter(loader))``,
i.e. everything between "the checkpoint is loaded" and "the first batch is in the main process",
worker start-up included. Baseline of the step-10 figure: the same path with no state (a fresh
start); baseline of the step-1M figure: the step-10 figure (target: within 2x, and under 1 s).

How the step-1M state is built without iterating 1M batches. The loader state is a pure function
of ``(epoch, position)`` per source (and shard), ``draws`` per interleaver, and counters, so it is
*computed*: a genuine state is taken after 10 batches (it has the exact structure: torchdata
snapshot, worker snapshots, shard ids), then every field that depends on the step is rewritten for
step ``N``:

* with ``W`` workers (round robin, ``in_order``), worker ``w`` produced ``N // W + (w < N % W)``
  batches, i.e. ``s_w = batches * batch_size`` samples;
* unpacked single source: ``epoch, position = divmod(s_w, rows_per_shard)`` (exact: no filtering);
* interleaved: ``draws = s_w``, and each child's sample count is obtained by replaying the
  interleaver's choice sequence (its per-block stratified uniforms, regenerated vectorised from the
  same ``(seed, name, rank, worker, block)`` RNG seeds), then ``divmod`` as above (exact);
* packed (best_fit): the number of documents the packer consumed by step ``N`` is extrapolated from
  the genuine step-10 state (documents per batch), the interleaver's children get the expected
  share ``documents * weight`` of them (replaying ~200k blocks would take seconds and the count is
  an estimate anyway), and the packer's buffer (open packs, as tensors) is the genuine one: the same size as at
  any step, but not the exact content of step ``N``;
* torchdata's counters (``_num_yielded``, ``_snapshot_step``, ``_sampler_iter_yielded``,
  ``samples_yielded``) are set to ``N`` (and ``N * batch_size``).

The construction is validated in every run: a state computed for a small step ``V`` from the
step-10 state is compared field by field (epochs, positions, draws) with the genuine state after
``V`` batches, for the unpacked and interleaved configurations.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np

from common import Result, log, make_datamodule, median, now

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


def _child_counts(interleaver, worker: int, draws: int, exact: bool = True) -> dict[str, int]:
    """How many samples each child of ``interleaver`` gave after ``draws`` draws of ``worker``.

    ``exact``: replay the choice sequence block by block (about 25 us per block of 256 draws);
    otherwise the expected counts ``draws * weight`` (off by O(sqrt(draws / 256)) samples).
    """
    from lightning_tune_data.streams.interleave import BLOCK_SIZE, _cumulative

    if not exact:
        expected = np.floor(np.asarray(interleaver._weights) * draws).astype(np.int64)
        expected[0] += draws - int(expected.sum())
        return dict(zip(interleaver._names, expected.tolist()))
    active = list(range(len(interleaver._names)))
    cumulative = np.asarray(_cumulative(active, interleaver._weights))
    counts = np.zeros(len(active), dtype=np.int64)
    full_blocks, rest = divmod(draws, BLOCK_SIZE)
    for block in range(full_blocks + (1 if rest else 0)):
        # the interleaver's _block_uniforms, without the round trip through a Python list
        rng = np.random.default_rng([interleaver._seed, interleaver._name_key, interleaver._rank, worker, block])
        uniforms = (rng.permutation(BLOCK_SIZE) + rng.random(BLOCK_SIZE)) / BLOCK_SIZE
        if block == full_blocks:
            uniforms = uniforms[:rest]
        choice = np.minimum(np.searchsorted(cumulative, uniforms, side="right"), len(active) - 1)
        counts += np.bincount(choice, minlength=len(active))
    return dict(zip(interleaver._names, counts.tolist()))


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
    interleaver = inner if hasattr(inner, "_block_uniforms") else None
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
            own["draws"] = draws
            counts = _child_counts(interleaver, worker, draws, exact=packer is None)
            children = own["children"]
        else:
            counts = {inner.dataset_name: draws}
            children = child_state
        for name, count in counts.items():
            source = children[name]
            rows_per_shard = source["num_rows"] // source["num_shards"]
            source["epoch"], source["position"] = _source_fields(count, rows_per_shard)

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
    """(worker, path, epoch, position) and draws, for comparing two states."""
    out = []
    for worker, dataset_state in _worker_dataset_states(state, num_workers):
        def grab(node: dict, worker=worker) -> None:
            if "position" in node and "num_rows" in node:
                out.append((worker, "source", node["shard_id"], node["epoch"], node["position"]))
            if "draws" in node:
                out.append((worker, "draws", node["draws"]))
        _walk(dataset_state, grab)
    return sorted(out)


def checkpoint(dm, loader_state: dict | None, batches: int) -> dict:
    if loader_state is None:
        return {}
    return {"version": 1, "signature": dm.data_signature(),
            "ranks": [{"batches_consumed": batches, "loader": loader_state}]}


def time_to_first_batch(dm, ckpt: dict) -> float:
    """Seconds from loading the data state to the first batch in the main process."""
    dm._pending_state = None
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
            if packing is None:
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
