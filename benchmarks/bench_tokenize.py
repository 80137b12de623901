"""Benchmark 10: ``prepare_data`` with a real BPE tokenizer against a plain ``datasets.map``.

A byte-level BPE ``tokenizer.json`` (vocabulary 8,192) is trained once, offline, with the
``tokenizers`` package on the benchmark's generated text (``--prepare-docs`` documents, JSON
Lines) and loaded with :class:`lightning_tune_data.TokenizerFileTokenizer`.

* Ours: cold ``TextDataModule.prepare_data()`` into an empty cache directory (JSON -> Arrow,
  tokenization with the default ``tokenize_text``, which hands each batch of texts to the
  tokenizer's batch encoder, ``save_to_disk``, fsync, atomic rename).
* Baseline: what a user writes with ``datasets`` and the same tokenizer file:
  ``load_dataset("json")`` -> ``map(batched=True)`` calling
  ``tokenizers.Tokenizer.encode_batch`` and adding BOS/EOS -> ``save_to_disk``.

Both at ``num_proc`` 1 and 2; documents/s, median of ``--prepare-repeats`` cold runs, alternated.
Goal: ratio >= 1. One untimed run of each on 2,000 documents comes first. The notes add the CPU-seconds of each run (this process and its ``datasets``
worker processes), a cross-check that other load on a shared machine distorts less than wall time.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from common import Result, log, median, now

VOCAB = 8192
SPECIALS = ["<bos>", "<eos>", "<pad>"]


def train_tokenizer(jsonl: Path, path: Path) -> Path:
    """A byte-level BPE tokenizer trained on the texts of ``jsonl`` (once; reused afterwards)."""
    if path.exists():
        return path
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())

    def texts():
        with open(jsonl) as handle:
            for line in handle:
                yield json.loads(line)["text"]

    tokenizer.train_from_iterator(texts(), trainer=trainer)
    tmp = path.with_suffix(".tmp")
    tokenizer.save(str(tmp))
    tmp.replace(path)
    return path


def ours_cold(jsonl: Path, tokenizer_json: Path, scratch: Path, num_proc: int) -> float:
    from lightning_tune_data import LocalDatasetManager, TextDataModule, TokenizerFileTokenizer

    cache_dir = Path(tempfile.mkdtemp(prefix="tok-ours-", dir=scratch))
    try:
        manager = LocalDatasetManager(data_files=str(jsonl), ds_type="json", num_proc=num_proc)
        dm = TextDataModule({"train": {"text": manager}}, cache_dir=str(cache_dir), max_seq_len=2048,
                            tokenizer=TokenizerFileTokenizer(str(tokenizer_json)))
        start = now()
        dm.prepare_data()
        return now() - start
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


class _Encode:
    """The map function a user writes: batch-encode with the tokenizer file, add BOS/EOS."""

    def __init__(self, tokenizer_json: Path) -> None:
        self.path = str(tokenizer_json)
        self._tokenizer = None

    def __call__(self, batch: dict) -> dict:
        if self._tokenizer is None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(self.path)
        bos, eos = self._tokenizer.token_to_id("<bos>"), self._tokenizer.token_to_id("<eos>")
        encoded = self._tokenizer.encode_batch(batch["text"], add_special_tokens=False)
        return {"input_ids": [[bos, *e.ids, eos] for e in encoded]}

    def __getstate__(self) -> dict:
        return {"path": self.path, "_tokenizer": None}


def plain_cold(jsonl: Path, tokenizer_json: Path, scratch: Path, num_proc: int) -> float:
    import datasets

    cache_dir = Path(tempfile.mkdtemp(prefix="tok-plain-", dir=scratch))
    try:
        start = now()
        ds = datasets.load_dataset("json", data_files=str(jsonl), split="train", cache_dir=str(cache_dir / "hf"),
                                   num_proc=num_proc)
        ds = ds.map(_Encode(tokenizer_json), batched=True, remove_columns=ds.column_names, num_proc=num_proc)
        ds.save_to_disk(str(cache_dir / "out"))
        elapsed = now() - start
        del ds
        return elapsed
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)


def _cpu_seconds() -> float:
    """CPU time of this process and of its finished child processes (``datasets``' map workers)."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def run(ctx) -> list[Result]:
    import datasets

    datasets.disable_progress_bars()
    jsonl, docs = ctx.text_jsonl, ctx.text_meta["num_docs"]
    tokenizer_json = train_tokenizer(jsonl, ctx.data_dir / f"bpe_{VOCAB}_{docs}.json")
    scratch = ctx.data_dir / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    # One untimed small run of each first: lazy imports and first-call set-up would otherwise
    # land in whichever timed run comes first.
    warmup = scratch / "warmup.jsonl"
    with open(jsonl) as source, open(warmup, "w") as target:
        target.writelines(line for _, line in zip(range(2000), source))
    ours_cold(warmup, tokenizer_json, scratch, 1)
    plain_cold(warmup, tokenizer_json, scratch, 1)
    times: dict[tuple[str, int], list[float]] = {}
    cpu: dict[tuple[str, int], list[float]] = {}
    for rep in range(ctx.prepare_repeats):
        for num_proc in (1, 2):
            for name, cold in (("ours", ours_cold), ("plain", plain_cold)):
                before = _cpu_seconds()
                times.setdefault((name, num_proc), []).append(cold(jsonl, tokenizer_json, scratch, num_proc))
                cpu.setdefault((name, num_proc), []).append(_cpu_seconds() - before)
        log("tokenize: repeat {}: ".format(rep + 1) + ", ".join(f"{k[0]}/np{k[1]} {v[-1]:.2f}s" for k, v in times.items()))
    results = []
    for num_proc in (1, 2):
        ours = [docs / t for t in times[("ours", num_proc)]]
        plain = [docs / t for t in times[("plain", num_proc)]]
        ratio = median(ours) / median(plain)
        results.append(Result("10 tokenize (BPE)", f"cold prepare_data, {docs:,} docs, BPE {VOCAB}, num_proc {num_proc}",
                              "documents/s", median(ours), "docs/s",
                              f"datasets load_dataset + map(encode_batch) + save_to_disk, num_proc {num_proc}",
                              median(plain), ">= 1x", ratio >= 1.0, repeats=ours,
                              note=f"ours {min(ours):,.0f}-{max(ours):,.0f}, plain {min(plain):,.0f}-{max(plain):,.0f} docs/s; "
                                   f"CPU-seconds per run (median): ours {median(cpu[('ours', num_proc)]):.2f}, "
                                   f"plain {median(cpu[('plain', num_proc)]):.2f}"))
    return results
