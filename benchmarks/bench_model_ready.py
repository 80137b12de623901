"""Benchmark 16: the in-process packed batch, as the loader hands it out and as the model gets it.

In one process, ``max_seq_len`` 2048, batch 8, everything timed in CPU microseconds per batch
(``time.process_time``: this process's threads only, so load from other processes moves it less
than wall time) and alternated round by round (medians of the rounds):

* **the blocks reader** (section 9's baseline: random ``[8, 2049]`` windows of a flat memory-mapped
  token array copied into one int64 block, split into inputs and shifted labels);
* **LitData's** ``TokensLoader`` (section 9's peer: shuffled pre-cut 2049-token blocks in a
  ``StreamingDataLoader``, each batch stacked into int64 ``input_ids`` and shifted ``labels``),
  measured when ``litdata`` is installed;
* **ours**, ``concat`` and ``best_fit`` over one source through ``train_dataloader()``: the
  *loader output* (compact batches: int32 ids, ``seq_lens``, provenance), the *model-ready batch*
  of a CPU run (the same, then ``expand_batch``: the five int64 planes the model trains on), and
  *full batches* (``compact_batches=False``: the five planes written by the collator);
* **two floors** with no documents at all: the *compact planes* (the blocks reader's windows
  written as an int32 ``[8, 2048]`` block plus a ``[8, 8]`` ``seq_lens``: what any loader of this
  format writes) and the *five planes* (the windows written as a packed batch's five int64 planes:
  what any producer of the model-ready format writes).

Then the parts of our model-ready batch inside the real loop (CPU µs per batch, each part's
function wrapped with a timer of the thread's CPU time): reading blocks of document references
(the keyed permutation included), placing documents into packs, joining the rows' tokens (reading
the documents' tokens), the rest of the collation (provenance, ``seq_lens``, the dtype check), the
state record after the batch, the rest (the train loader and handing out the packs), and the
expansion into the five planes.

Throughput rows are real tokens per CPU-second (our provenance's ``tokens``, ``8 x 2048`` for the
readers of pre-cut blocks) so that ``ratio`` reads as "x of the baseline". Run on its own:
``python benchmarks/run_all.py --only model_ready [--quick]``.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from bench_hotpath import PACKED_BATCH, SEQ, BlocksReader, flat_offsets, flat_tokens
from common import Result, log, make_datamodule, median, parts_per_batch_us, real_tokens
from peers import LITDATA_HINT, litdata_blocks_loader, litdata_version

STRATEGIES = ("concat", "best_fit")
#: The goals of the loader output against the blocks reader, per strategy.
GOALS = {"concat": 0.5, "best_fit": 0.3}
#: Documents per row the compact-planes floor writes lengths for (a packed row holds 5-10).
FLOOR_DOCUMENTS = 8


class CompactPlanesFloor(BlocksReader):
    """The blocks reader's windows written as a compact batch's planes: int32 ``[B, 2048]`` token ids
    and ``[B, 8]`` int64 ``seq_lens``. No documents: what any loader of the compact format writes."""

    def __init__(self, flat: np.ndarray, batch_size: int, seed: int) -> None:
        super().__init__(flat, batch_size, seed)
        self.lengths = [SEQ // FLOOR_DOCUMENTS] * (batch_size * FLOOR_DOCUMENTS)

    def __next__(self) -> dict[str, Any]:
        starts = self.rng.integers(0, len(self.flat) - SEQ - 1, size=self.batch_size)
        ids = np.empty((self.batch_size, SEQ), dtype=np.int32)
        for row, start in enumerate(starts.tolist()):
            ids[row] = self.flat[start : start + SEQ]
        seq_lens = np.array(self.lengths, dtype=np.int64).reshape(self.batch_size, FLOOR_DOCUMENTS)
        return {"input_ids": torch.from_numpy(ids), "seq_lens": torch.from_numpy(seq_lens),
                "num_tokens": self.batch_size * SEQ}


class FivePlanesFloor(BlocksReader):
    """The blocks reader's windows written as a packed batch's five int64 ``[B, 2048]`` planes (tokens,
    shifted labels, ``position_ids``, ``document_ids`` 0, attention mask 1). No documents: what any
    producer of the model-ready format writes."""

    def __init__(self, flat: np.ndarray, batch_size: int, seed: int) -> None:
        super().__init__(flat, batch_size, seed)
        self.columns = np.arange(SEQ, dtype=np.int64)

    def __next__(self) -> dict[str, Any]:
        starts = self.rng.integers(0, len(self.flat) - SEQ - 1, size=self.batch_size)
        planes = np.empty((5, self.batch_size, SEQ), dtype=np.int64)
        for row, start in enumerate(starts.tolist()):
            window = self.flat[start : start + SEQ + 1]
            planes[0, row] = window[:-1]
            planes[1, row] = window[1:]
        planes[2] = self.columns
        planes[3].fill(0)
        planes[4].fill(1)
        batch: dict[str, Any] = dict(zip(("input_ids", "labels", "position_ids", "document_ids", "attention_mask"),
                                         map(torch.from_numpy, planes)))
        batch["num_tokens"] = self.batch_size * SEQ
        return batch


def _ours(dm, compact: bool, expand: bool):
    """An iterator over ``dm``'s train batches, compact or full, expanded on the host when asked."""
    from lightning_tune_data.collate import PackedCollator, expand_batch

    dm.train_collator = lambda: PackedCollator(pad_id=dm.tokenizer.pad_id, max_seq_len=SEQ, compact=compact)
    batches = iter(dm.train_dataloader())
    return map(expand_batch, batches) if expand else batches


def cpu_per_batch(reader, batches: int) -> tuple[float, float]:
    """CPU µs per batch and real tokens per CPU-second of ``batches`` batches of ``reader``."""
    for _ in range(3):
        next(reader)
    tokens, start = 0, time.process_time()
    for _ in range(batches):
        tokens += real_tokens(next(reader))
    spent = max(time.process_time() - start, 1e-9)
    return spent / batches * 1e6, tokens / spent


def cpu_parts(make_batches, parts: dict[str, tuple[object, str]], batches: int) -> dict[str, float]:
    """CPU µs per batch of each part (``name: (owner, attribute)``, timed by this thread's CPU time)
    inside ``batches`` batches of the iterator ``make_batches()`` returns, and of the whole batch
    (``"whole"``, this process's CPU time): see :func:`common.parts_per_batch_us`."""
    return parts_per_batch_us(make_batches, parts, batches, time.thread_time_ns, time.process_time_ns)


def loader_parts(dm, strategy: str, batches: int) -> dict[str, float]:
    """CPU µs per batch of each part of our model-ready batch inside the real loop (module
    docstring): the loader output's parts and the expansion."""
    import lightning_tune_data.collate as collate_package
    import lightning_tune_data.collate.compact as compact_module
    from lightning_tune_data.collate.packed import PackedCollator
    from lightning_tune_data.loading.resumable_loader import ResumableLoader
    from lightning_tune_data.packing.progress import PackingProgress
    from lightning_tune_data.packing.strategies import get_strategy

    return cpu_parts(lambda: _ours(dm, True, True), {
        "block reading": (PackingProgress, "read_block"), "placement": (get_strategy(strategy), "place_block"),
        "collation": (PackedCollator, "__call__"), "join of the rows": (compact_module, "write_rows"),
        "state record": (ResumableLoader, "_remember"), "expansion": (collate_package, "expand_batch")},
        batches)


def run(ctx) -> list[Result]:
    batches = 300 if ctx.quick else 1500
    rounds = ctx.repeats
    dms = {strategy: make_datamodule(ctx.token_parquet, ctx.cache_dir, False, strategy, 0, PACKED_BATCH)
           for strategy in STRATEGIES}
    web = dms["concat"]._datasets["train"]["web"]
    flat_path, offsets_path = (ctx.data_dir / f"flat_{kind}_{ctx.token_docs}.npy" for kind in ("tokens", "offsets"))
    flat = flat_tokens(web, flat_path)
    flat_offsets(web, offsets_path)
    litdata = litdata_version()
    readers = {"blocks": lambda seed: BlocksReader(flat, PACKED_BATCH, seed),
               "compact planes floor": lambda seed: CompactPlanesFloor(flat, PACKED_BATCH, seed),
               "five planes floor": lambda seed: FivePlanesFloor(flat, PACKED_BATCH, seed)}
    if litdata is not None:
        readers["litdata"] = lambda seed: iter(litdata_blocks_loader(ctx.data_dir, flat_path, offsets_path,
                                                                      ctx.token_docs, PACKED_BATCH, SEQ, seed=seed))
    for strategy, dm in dms.items():
        readers[f"{strategy} compact"] = lambda seed, dm=dm: _ours(dm, True, False)
        readers[f"{strategy} model-ready"] = lambda seed, dm=dm: _ours(dm, True, True)
        readers[f"{strategy} full"] = lambda seed, dm=dm: _ours(dm, False, False)
    samples: dict[str, list[tuple[float, float]]] = {}
    for round_ in range(rounds):
        for name, make in readers.items():
            samples.setdefault(name, []).append(cpu_per_batch(make(round_), batches))
        log(f"model_ready: round {round_ + 1}/{rounds}")
    rounds_of_parts = [{strategy: loader_parts(dm, strategy, batches) for strategy, dm in dms.items()}
                       for _ in range(rounds)]
    parts = {strategy: {name: median(round_[strategy][name] for round_ in rounds_of_parts)
                        for name in rounds_of_parts[0][strategy]} for strategy in dms}
    return results_of(samples, parts, litdata, rounds, batches)


def results_of(samples: dict[str, list[tuple[float, float]]], parts: dict[str, dict[str, float]],
               litdata: str | None, rounds: int, batches: int) -> list[Result]:
    """The table's rows from the rounds' medians (tokens per CPU-second, CPU µs per batch in the notes)."""
    def rate(name: str) -> float:
        return median(sample[1] for sample in samples[name])

    def us(name: str) -> float:
        return median(sample[0] for sample in samples[name])

    bench, unit = "16 model-ready", "tok/CPU-s"
    blocks = f"blocks reader: random [{PACKED_BATCH}, {SEQ + 1}] windows, int64"
    how = f"{batches} batches per round, median of {rounds} alternated rounds"
    results = [Result(bench, "blocks reader", "tokens per CPU-second", rate("blocks"), unit,
                      note=f"{us('blocks'):.0f} us/batch; {how}")]
    for floor in ("compact planes floor", "five planes floor"):
        results.append(Result(bench, f"{floor} (no documents)", "tokens per CPU-second", rate(floor), unit, blocks,
                              rate("blocks"), note=f"{us(floor):.0f} us/batch"))
    peer = None
    if litdata is None:
        results.append(Result(bench, "LitData (peer)", "not measured", float("nan"), "", note=LITDATA_HINT))
    else:
        peer = f"LitData {litdata} TokensLoader, shuffled [{PACKED_BATCH}, {SEQ + 1}] blocks, int64 collate"
        results.append(Result(bench, peer, "tokens per CPU-second", rate("litdata"), unit, blocks, rate("blocks"),
                              note=f"{us('litdata'):.0f} us/batch; input_ids and labels only"))
    for strategy in STRATEGIES:
        compact, ready, full = (f"{strategy} {kind}" for kind in ("compact", "model-ready", "full"))
        goal = GOALS[strategy]
        met = rate(compact) / rate("blocks") >= goal
        results.append(Result(bench, f"{strategy}, loader output (compact)", "tokens per CPU-second", rate(compact), unit,
                              blocks, rate("blocks"), f">= {goal}x", met,
                              note=f"{us(compact):.0f} us/batch; {rate(compact) / rate('compact planes floor'):.2f}x "
                                   "the compact-planes floor"))
        note = (f"{us(ready):.0f} us/batch; {rate(ready) / rate('blocks'):.3f}x the blocks reader, "
                f"{rate(ready) / rate('five planes floor'):.2f}x the five-planes floor")
        if peer is None:
            results.append(Result(bench, f"{strategy}, model-ready on CPU (compact + expanded)", "tokens per CPU-second",
                                  rate(ready), unit, blocks, rate("blocks"), note=note))
        else:
            results.append(Result(bench, f"{strategy}, model-ready on CPU (compact + expanded)", "tokens per CPU-second",
                                  rate(ready), unit, peer, rate("litdata"), ">= 1x", rate(ready) >= rate("litdata"),
                                  note=note))
        results.append(Result(bench, f"{strategy}, full batches (compact_batches=False)", "tokens per CPU-second",
                              rate(full), unit, blocks, rate("blocks"),
                              note=f"{us(full):.0f} us/batch; {rate(full) / rate('five planes floor'):.2f}x the "
                                   "five-planes floor"))
        loop = parts[strategy]
        collation_rest = loop["collation"] - loop["join of the rows"]
        rest = loop["whole"] - sum(loop[name] for name in ("block reading", "placement", "collation", "state record",
                                                           "expansion"))
        split = (f"block reading {loop['block reading']:.0f}, placement {loop['placement']:.0f}, join of the rows "
                 f"{loop['join of the rows']:.0f}, rest of the collation {collation_rest:.0f}, state record "
                 f"{loop['state record']:.0f}, loader and the rest {rest:.0f}, expansion {loop['expansion']:.0f}")
        results.append(Result(bench, f"{strategy}, model-ready batch: parts in the real loop", "CPU us per batch",
                              loop["whole"], "us", note=split))
    return results
