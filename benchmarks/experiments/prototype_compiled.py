"""What a compiled kernel would buy on the packed hot path: a measured prototype (writes
results/compiled-prototype.md). Not part of the suite, and numba is not a dependency.

Usage (from the repository root, after ``run_all.py`` has built ``benchmarks/.data``; numba from
PyPI in any environment the package's own environment can import, e.g. a scratch venv put on
``PYTHONPATH``)::

    python benchmarks/experiments/prototype_compiled.py [--token-docs 200000] [--batches 1500] [--rounds 5]

Two kernels, each checked against the package's own result before it is timed:

* **Collation in one pass** (``fill_rows``): a batch's ``[5, B, width]`` block (tokens, labels,
  ``position_ids``, ``document_ids``, attention mask) and its ``seq_lens`` written in one loop over
  the pieces' token ranges, instead of a byte join plus one NumPy pass per output. It replaces the
  body of ``PackedCollator``'s bulk path in the real train loop (``CompiledCollator``: the same
  pieces, state and provenance; it asserts the same batches as ours on the first batches), so
  the rows "ours + compiled collation" are whole batches through ``train_dataloader()``.
* **The five planes alone** (``FivePlaneBlocks``): the blocks reader's windows written as the
  five ``[8, 2048]`` int64 planes of a packed batch (tokens, shifted labels, a row of positions,
  zeros, ones): the memory traffic of the output format, with no documents at all.
* **``best_fit`` placement on integer lengths** (``best_fit_kernel``): the packer's rule (the
  tightest of at most 64 open packs, oldest on ties; the fullest finished when more are open)
  over a block's lengths, against the same rule in Python (the best-fit floor's loop), same
  documents, same assignment asserted; microseconds per 8 finished packs.

Every figure is the median of ``--rounds`` rounds that alternate all readers (wall clock, the
blocks reader measured in each round: ratios are per round, then the median).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the suite's modules

import common  # noqa: E402
from bench_hotpath import PACKED_BATCH, SEQ, BlocksReader, flat_offsets, flat_tokens  # noqa: E402
from common import RESULTS_DIR  # noqa: E402

import numba  # noqa: E402  (the prototype's one extra package)

from lightning_tune_data.collate import PackedCollator  # noqa: E402
from lightning_tune_data.collate.base import padded_length  # noqa: E402
from lightning_tune_data.collate.packed import _outputs  # noqa: E402
from lightning_tune_data.keys import (DROPPED_BEFORE, EPOCH, NEW_DOCUMENT, PROVENANCE, ROW, SEQ_LENS,  # noqa: E402
                                      SOURCE, TOKENS, TRUNCATED_TOKENS)
from lightning_tune_data.packing.pieces import (DROPPED_AT, EPOCH_AT, LENGTH_AT, NEW_DOCUMENT_AT,  # noqa: E402
                                                SOURCE_AT, TRUNCATED_AT)


@numba.njit(nogil=True, cache=True)
def fill_rows(flat, starts, lens, counts, width, pad_id, out, seq_lens):  # pragma: no cover - compiled
    """Every output of a packed batch in one pass over the pieces (``out``: ``[5, B, width]``)."""
    piece = 0
    for row in range(counts.shape[0]):
        col = 0
        for document in range(counts[row]):
            start, n = starts[piece], lens[piece]
            seq_lens[row, document] = n
            for j in range(n):
                out[0, row, col + j] = flat[start + j]
                out[1, row, col + j] = flat[start + j + 1] if j + 1 < n else -100
                out[2, row, col + j] = j
                out[3, row, col + j] = document
                out[4, row, col + j] = 1
            col += n
            piece += 1
        for c in range(col, width):
            out[0, row, c] = pad_id
            out[1, row, c] = -100
            out[2, row, c] = 0
            out[3, row, c] = -1
            out[4, row, c] = 0


class CompiledCollator(PackedCollator):
    """``PackedCollator`` whose bulk path writes the block with :func:`fill_rows` (one source, every
    piece a position, no masked labels; anything else takes the package's path)."""

    checks = 20  # the first batches are compared with the package's own collation

    def _collate_packs(self, packs):
        stores = packs[0].stores
        if not stores or len(stores) != 1 or any(p.stores is not stores or p.extras is not None for p in packs):
            return super()._collate_packs(packs)
        flat = next(iter(stores.values())).flat_tokens()
        refs = [p.refs for p in packs]
        counts = list(map(len, refs))
        columns = tuple(zip(*itertools.chain.from_iterable(refs)))
        lens = columns[LENGTH_AT]
        width = padded_length(max(p.length for p in packs), self.pad_to_multiple_of)
        views, planes, seq_lens, seq_lens_tensor = _outputs(5, len(packs), width, max(counts))
        starts = np.fromiter(itertools.chain.from_iterable(p.tokens for p in packs), dtype=np.int64, count=len(lens))
        fill_rows(flat, starts, np.array(lens, dtype=np.int64), np.array(counts, dtype=np.int64), width, self.pad_id,
                  views, seq_lens)
        batch = dict(zip(self._ARRAY_KEYS, planes))
        batch["attention_mask"] = planes[4]
        batch[SEQ_LENS] = seq_lens_tensor
        batch[PROVENANCE] = {
            SOURCE: list(columns[SOURCE_AT]), EPOCH: list(columns[EPOCH_AT]), TOKENS: list(lens),
            ROW: list(itertools.chain.from_iterable(itertools.starmap(itertools.repeat, enumerate(counts)))),
            NEW_DOCUMENT: list(columns[NEW_DOCUMENT_AT]), DROPPED_BEFORE: list(columns[DROPPED_AT]),
            TRUNCATED_TOKENS: list(columns[TRUNCATED_AT]),
        }
        if self.checks:
            self.checks -= 1
            expected = super()._collate_packs(packs)
            assert all(torch.equal(batch[k], v) for k, v in expected.items() if isinstance(v, torch.Tensor))
            assert batch[PROVENANCE] == expected[PROVENANCE]
        return batch


SHIFT = 40


@numba.njit(nogil=True, cache=True)
def best_fit_kernel(lengths, cap, buffer_size, batch, rows, free, meta):  # pragma: no cover - compiled
    """Best-fit over ``lengths`` until ``batch`` packs are finished; ``rows[i]`` gets document
    ``i``'s pack number. The open packs carry over between calls: ``free`` (sorted
    ``(space << SHIFT) | number``, ``buffer_size + 2`` slots) and ``meta`` (open count, next
    number). Returns (documents placed, the finished packs' numbers)."""
    size, number, done = meta[0], meta[1], 0
    finished = np.empty(batch + 2, dtype=np.int64)
    mask = (1 << SHIFT) - 1
    placed = 0
    for i in range(lengths.shape[0]):
        n = lengths[i]
        need = n << SHIFT
        k = np.searchsorted(free[:size], need)
        if k < size:
            key = free[k]
            for m in range(k, size - 1):
                free[m] = free[m + 1]
            size -= 1
            rows[i] = key & mask
            rest = key - need
            if rest > mask:
                j = np.searchsorted(free[:size], rest)
                for m in range(size, j, -1):
                    free[m] = free[m - 1]
                free[j] = rest
                size += 1
            else:
                finished[done] = key & mask
                done += 1
        else:
            rows[i] = number
            if n == cap:
                finished[done] = number
                done += 1
            else:
                key = ((cap - n) << SHIFT) | number
                j = np.searchsorted(free[:size], key)
                for m in range(size, j, -1):
                    free[m] = free[m - 1]
                free[j] = key
                size += 1
                if size > buffer_size:
                    finished[done] = free[0] & mask
                    done += 1
                    for m in range(size - 1):
                        free[m] = free[m + 1]
                    size -= 1
            number += 1
        placed = i + 1
        if done >= batch:
            break
    meta[0], meta[1] = size, number
    return placed, finished[:done]


def best_fit_python(lengths, cap, buffer_size, batch, rows, first, state):
    """The same rule in Python (the best-fit floor's loop, the packer's ``place_block``) over a
    list of lengths from ``first`` on; the open packs carry over in ``state`` (free keys, next number)."""
    free, number = state
    finished, mask = [], (1 << SHIFT) - 1
    for i in range(first, len(lengths)):
        n = lengths[i]
        need = n << SHIFT
        k = bisect.bisect_left(free, need)
        if k < len(free):
            key = free.pop(k)
            rows[i] = key & mask
            if key - need > mask:
                bisect.insort(free, key - need)
            else:
                finished.append(key & mask)
        else:
            rows[i] = number
            if n == cap:
                finished.append(number)
            else:
                bisect.insort(free, ((cap - n) << SHIFT) | number)
                if len(free) > buffer_size:
                    finished.append(free.pop(0) & mask)
            number += 1
        if len(finished) >= batch:
            state[1] = number
            return i + 1 - first, finished
    state[1] = number
    return len(lengths) - first, finished


class FivePlaneBlocks(BlocksReader):
    """The blocks reader writing a packed batch's five ``[8, 2048]`` int64 planes: its windows as
    tokens, shifted labels, ``position_ids`` (one row of ``0..2047`` each), ``document_ids`` (0) and
    an attention mask (1). No documents: the memory traffic any producer of this format pays."""

    def __init__(self, flat: np.ndarray, batch_size: int, seed: int) -> None:
        super().__init__(flat, batch_size, seed)
        self.columns = np.arange(SEQ, dtype=np.int64)

    def __next__(self) -> dict[str, torch.Tensor]:
        starts = self.rng.integers(0, len(self.flat) - SEQ - 1, size=self.batch_size)
        planes = np.empty((5, self.batch_size, SEQ), dtype=np.int64)
        for row, start in enumerate(starts.tolist()):
            window = self.flat[start : start + SEQ + 1]
            planes[0, row] = window[:-1]
            planes[1, row] = window[1:]
        planes[2] = self.columns
        planes[3].fill(0)
        planes[4].fill(1)
        return dict(zip(("input_ids", "labels", "position_ids", "document_ids", "attention_mask"),
                        map(torch.from_numpy, planes)))


def loader_us(dm, collator, batches: int) -> float:
    """Wall µs per batch through ``train_dataloader()`` (``collator``: swapped in when given)."""
    if collator is not None:
        dm.train_collator = lambda: collator
    else:
        dm.__dict__.pop("train_collator", None)  # the datamodule's own collator
    it = iter(dm.train_dataloader())
    for _ in range(5):
        next(it)
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    return (time.perf_counter() - start) / batches * 1e6


def blocks_us(flat: np.ndarray, batches: int, seed: int, reader_class: type = BlocksReader) -> float:
    reader = reader_class(flat, PACKED_BATCH, seed)
    for _ in range(5):
        next(reader)
    start = time.perf_counter()
    for _ in range(batches):
        next(reader)
    return (time.perf_counter() - start) / batches * 1e6


def placement_us(compiled: bool, lengths: np.ndarray, batches: int) -> float:
    """µs per 8 finished packs, placing the documents that follow the last batch's."""
    rows = np.empty(len(lengths), dtype=np.int64) if compiled else [0] * len(lengths)
    values = lengths if compiled else lengths.tolist()
    free, meta, state = np.empty(64 + 2, dtype=np.int64), np.zeros(2, dtype=np.int64), [[], 0]
    at, start = 0, time.perf_counter()
    for _ in range(batches):
        if at + 2048 > len(lengths):
            at = 0
        if compiled:
            placed, _ = best_fit_kernel(values[at:at + 2048], SEQ, 64, PACKED_BATCH, rows[at:], free, meta)
        else:
            placed, _ = best_fit_python(values, SEQ, 64, PACKED_BATCH, rows, at, state)
        at += placed  # the next call starts after them
    return (time.perf_counter() - start) / batches * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--token-docs", type=int, default=200_000)
    parser.add_argument("--batches", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--data-dir", type=Path, default=common.BENCH_DIR / ".data")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "compiled-prototype.md")
    args = parser.parse_args(argv)
    parquet, cache = args.data_dir / f"tokens_{args.token_docs}.parquet", args.data_dir / f"cache_{args.token_docs}"
    dms = {s: common.make_datamodule(parquet, cache, False, s, 0, PACKED_BATCH) for s in ("concat", "best_fit")}
    web = dms["concat"]._datasets["train"]["web"]
    flat = flat_tokens(web, args.data_dir / f"flat_tokens_{args.token_docs}.npy")
    lengths = np.minimum(np.diff(flat_offsets(web, args.data_dir / f"flat_offsets_{args.token_docs}.npy")), SEQ)
    lengths = lengths[np.random.default_rng(0).permutation(len(lengths))].astype(np.int64)
    rows_python, rows_compiled = np.empty(4096, dtype=np.int64), np.empty(4096, dtype=np.int64)
    state, free, meta = [[], 0], np.empty(64 + 2, dtype=np.int64), np.zeros(2, dtype=np.int64)
    for at in (0, 1000, 2000):  # three calls, the open packs carried over
        want = best_fit_python(lengths[:4096].tolist(), SEQ, 64, 60, rows_python, at, state)
        got = best_fit_kernel(lengths[at:4096], SEQ, 64, 60, rows_compiled[at:], free, meta)
        assert got[0] == want[0] and got[1].tolist() == want[1]
        assert np.array_equal(rows_python[at:at + want[0]], rows_compiled[at:at + got[0]])
        assert sorted(state[0]) == free[:meta[0]].tolist() and state[1] == meta[1]
    pad_id = dms["concat"].train_collator().pad_id
    compiled = {s: CompiledCollator(pad_id, SEQ) for s in dms}
    for strategy, dm in dms.items():  # compile, and check the first batches against ours, before timing
        loader_us(dm, compiled[strategy], 30)
    rounds: dict[str, list[float]] = {}
    for r in range(args.rounds):
        common.log(f"prototype: round {r + 1}/{args.rounds}")
        timings = {"blocks": blocks_us(flat, args.batches, r),
                   "five planes": blocks_us(flat, args.batches, r, FivePlaneBlocks)}
        for strategy, dm in dms.items():
            timings[strategy] = loader_us(dm, None, args.batches)
            timings[f"{strategy} compiled"] = loader_us(dm, compiled[strategy], args.batches)
        timings["placement python"] = placement_us(False, lengths, args.batches)
        timings["placement compiled"] = placement_us(True, lengths, args.batches)
        for key, value in timings.items():
            rounds.setdefault(key, []).append(value)
            rounds.setdefault(f"{key}/ratio", []).append(timings["blocks"] / value)
    args.out.write_text(report(rounds, args))
    print(args.out.read_text())
    return 0


def report(rounds: dict[str, list[float]], args: argparse.Namespace) -> str:
    med = {k: float(np.median(v)) for k, v in rounds.items()}
    rows = [
        ("blocks reader, [8, 2049] windows", "blocks"),
        ("the same windows written as a packed batch's five [8, 2048] int64 planes (no documents)", "five planes"),
        ("ours, concat, whole batch via train_dataloader()", "concat"),
        ("ours, concat + compiled collation (fill_rows)", "concat compiled"),
        ("ours, best_fit, whole batch via train_dataloader()", "best_fit"),
        ("ours, best_fit + compiled collation (fill_rows)", "best_fit compiled"),
    ]
    lines = [
        "# Packed hot path: what a compiled kernel would buy (prototype, numba " + numba.__version__ + ")",
        "",
        f"Command: `PYTHONPATH=<numba> python benchmarks/experiments/prototype_compiled.py --token-docs {args.token_docs} "
        f"--batches {args.batches} --rounds {args.rounds}`",
        f"Finished {time.strftime('%Y-%m-%d %H:%M:%S')}; {args.rounds} rounds alternating every reader, "
        f"{args.batches} batches each, wall µs per batch (medians); ratio = the blocks reader's time / this, "
        "per round, median. max_seq_len 2048, batch 8, in-process, one source.",
        "",
        "| reader | µs per batch | blocks reader's time / this |",
        "|---|---:|---:|",
    ]
    lines += [f"| {name} | {med[key]:.0f} | {med[key + '/ratio']:.3f}x |" for name, key in rows]
    lines += [
        "",
        "`best_fit` placement alone, on a block's integer lengths (the same documents and assignment):",
        "",
        "| placement | µs per 8 finished packs |",
        "|---|---:|",
        f"| Python (bisect over integer keys, the packer's loop) | {med['placement python']:.1f} |",
        f"| compiled (best_fit_kernel) | {med['placement compiled']:.1f} |",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
