"""Benchmark 4: ``prepare_data`` (tokenize + cache) throughput and the cache-hit path.

Data: ``--prepare-docs`` short text documents (JSON Lines, ~100 characters each), tokenized with the
``ByteTokenizer`` by the default ``preprocess_function`` (``tokenize_text``: BOS + bytes + EOS).

* ``prepare_data`` cold, ``num_proc`` 1 and 2: ``TextDataModule.prepare_data()`` into an empty cache
  directory (JSON -> Arrow conversion by ``datasets``, tokenization ``Dataset.map``, ``save_to_disk``,
  fsync, atomic rename). Baseline: the plain ``datasets`` path doing the same work with the same
  function and ``num_proc`` (``load_dataset("json")`` -> ``map(batched=True)`` -> ``save_to_disk``),
  so the ratio is the package's overhead. A third row gives the ``num_proc=2`` speed-up over
  ``num_proc=1``.
* cache hit: a new ``TextDataModule`` over the same managers, ``prepare_data()`` + ``setup("fit")``
  on the existing cache (fingerprinting the data file, validating the marker, memory-mapping the
  cache). Target: < 2 s for 200k documents. Baseline: ``datasets.Dataset.load_from_disk`` of that
  cache alone.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from common import Result, log, median, now


def _manager(jsonl: Path, num_proc: int):
    from lightning_tune_data import LocalDatasetManager

    return LocalDatasetManager(data_files=str(jsonl), ds_type="json", num_proc=num_proc)


def _datamodule(jsonl: Path, cache_dir: Path, num_proc: int):
    from lightning_tune_data import TextDataModule

    return TextDataModule({"train": {"text": _manager(jsonl, num_proc)}}, cache_dir=str(cache_dir), max_seq_len=2048)


def ours_cold(jsonl: Path, scratch: Path, num_proc: int) -> float:
    cache_dir = Path(tempfile.mkdtemp(prefix="prep-ours-", dir=scratch))
    try:
        dm = _datamodule(jsonl, cache_dir, num_proc)
        start = now()
        dm.prepare_data()
        return now() - start
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def plain_cold(jsonl: Path, scratch: Path, num_proc: int) -> float:
    import datasets

    from lightning_tune_data.preprocess import tokenize_text
    from lightning_tune_data.tokenizers import ByteTokenizer

    cache_dir = Path(tempfile.mkdtemp(prefix="prep-plain-", dir=scratch))
    tokenizer = ByteTokenizer()
    try:
        start = now()
        ds = datasets.load_dataset("json", data_files=str(jsonl), split="train", cache_dir=str(cache_dir / "hf"),
                                   num_proc=num_proc)
        ds = ds.map(tokenize_text, batched=True, fn_kwargs={"tokenizer": tokenizer}, remove_columns=ds.column_names,
                    num_proc=num_proc)
        ds.save_to_disk(str(cache_dir / "out"))
        elapsed = now() - start
        del ds
        return elapsed
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def cache_hit(jsonl: Path, cache_dir: Path) -> float:
    start = now()
    dm = _datamodule(jsonl, cache_dir, 1)
    dm.prepare_data()
    dm.setup("fit")
    elapsed = now() - start
    assert len(dm._datasets["train"]["text"]) > 0
    return elapsed


def load_only(path: Path) -> float:
    import datasets

    start = now()
    ds = datasets.Dataset.load_from_disk(str(path))
    elapsed = now() - start
    assert len(ds) > 0
    return elapsed


def run(ctx) -> list[Result]:
    import datasets

    datasets.disable_progress_bars()
    jsonl, meta = ctx.text_jsonl, ctx.text_meta
    docs = meta["num_docs"]
    tokens = meta["chars"] + 2 * docs  # ASCII text: one byte token per character, plus BOS/EOS
    scratch = ctx.data_dir / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    times: dict[tuple[str, int], list[float]] = {}
    for rep in range(ctx.prepare_repeats):
        for num_proc in (1, 2):
            times.setdefault(("ours", num_proc), []).append(ours_cold(jsonl, scratch, num_proc))
            times.setdefault(("plain", num_proc), []).append(plain_cold(jsonl, scratch, num_proc))
        log("prepare: repeat {}: ".format(rep + 1) + ", ".join(f"{k[0]}/np{k[1]} {v[-1]:.2f}s" for k, v in times.items()))
    results = []
    for num_proc in (1, 2):
        ours = [docs / t for t in times[("ours", num_proc)]]
        plain = [docs / t for t in times[("plain", num_proc)]]
        results.append(Result("4 prepare_data", f"cold, {docs:,} docs, num_proc {num_proc}", "documents/s",
                              median(ours), "docs/s", f"plain datasets load+map+save, num_proc {num_proc}",
                              median(plain), repeats=ours,
                              note=f"{median(ours) * tokens / docs:,.0f} tokens/s; {median(times[('ours', num_proc)]):.2f}s"))
    ours1 = [docs / t for t in times[("ours", 1)]]
    ours2 = [docs / t for t in times[("ours", 2)]]
    results.append(Result("4 prepare_data", f"cold, {docs:,} docs", "num_proc 2 speed-up", median(ours2), "docs/s",
                          "num_proc 1", median(ours1), repeats=ours2))

    # cache hit
    cache_dir = ctx.data_dir / "prepare_cache"
    shutil.rmtree(cache_dir, ignore_errors=True)
    dm = _datamodule(jsonl, cache_dir, 2)
    dm.prepare_data()
    cached = _manager(jsonl, 2).cache_dir_for(dm.tokenizer, cache_dir) / "dataset"
    hits, loads = [], []
    cache_hit(jsonl, cache_dir)  # warm imports/page cache once
    for _ in range(ctx.resume_repeats):
        hits.append(cache_hit(jsonl, cache_dir))
        loads.append(load_only(cached))
    hit = median(hits)
    results.append(Result("4 prepare_data", f"cache hit, {docs:,} docs", "prepare_data + setup", hit, "s",
                          "datasets.Dataset.load_from_disk alone", median(loads),
                          f"< 2 s{'' if docs == 200_000 else ' (for 200k docs)'}", hit < 2.0, repeats=hits))
    shutil.rmtree(cache_dir, ignore_errors=True)
    return results
