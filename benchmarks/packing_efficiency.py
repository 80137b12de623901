"""Packing efficiency of ``IterablePackedDataset`` strategies on synthetic document lengths.

Packs ``--num-docs`` documents with log-normal (mean ~300) and uniform (1..599, mean 300) lengths
into packs of ``--max-seq-len`` tokens with ``greedy``, ``best_fit`` and ``concat``, and prints a
Markdown table:

* non-padding share: tokens in packs / (packs x max_seq_len), i.e. what a collator padding every
  pack to ``max_seq_len`` would keep as real tokens;
* tokens kept: tokens in packs / tokens in the documents (``greedy``/``best_fit`` truncate
  documents longer than ``max_seq_len``; ``concat`` keeps everything);
* documents per pack (for ``concat``: document pieces per pack);
* packs/s: single-process packing throughput, including reading the in-memory source.

Usage::

    python benchmarks/packing_efficiency.py [--num-docs 20000] [--max-seq-len 2048] [--out table.md]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from lightning_tune_data.sources.memory import InMemoryStream
from lightning_tune_data.packing.packer import PACKING_STRATEGIES, IterablePackedDataset


def lognormal_lengths(n: int, mean: float, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Log-normal lengths with the given mean (``mu = log(mean) - sigma^2 / 2``), at least 1."""
    mu = np.log(mean) - sigma**2 / 2
    return np.maximum(1, np.round(rng.lognormal(mu, sigma, n))).astype(np.int64)


def uniform_lengths(n: int, mean: float, rng: np.random.Generator) -> np.ndarray:
    """Uniform lengths on ``1..2*mean-1`` (mean ``mean``)."""
    return rng.integers(1, int(2 * mean), size=n, dtype=np.int64)


def measure(lengths: np.ndarray, strategy: str, max_seq_len: int, buffer_size: int, seed: int) -> dict:
    """Pack documents of the given lengths once (one pass, shuffled) and return the statistics.

    Args:
        lengths: document lengths in tokens.
        strategy: packing strategy.
        max_seq_len: pack capacity.
        buffer_size: open packs for ``best_fit``.
        seed: shuffle seed of the source.
    """
    docs = [np.ones(n, dtype=np.int64) for n in lengths]
    stream = InMemoryStream(docs, "bench", seed=seed, num_passes=1)
    packer = IterablePackedDataset(stream, max_seq_len, strategy=strategy, buffer_size=buffer_size)
    start = time.perf_counter()
    packs = tokens = pieces = 0
    for pack in packer:
        packs += 1
        tokens += len(pack["input_ids"])
        pieces += len(pack["seq_lens"])
    elapsed = time.perf_counter() - start
    return {
        "packs": packs,
        "non_padding": tokens / (packs * max_seq_len),
        "tokens_kept": tokens / int(lengths.sum()),
        "docs_per_pack": pieces / packs,
        "packs_per_s": packs / elapsed,
        "truncated": packer.counters["overlong_truncated"],
    }


def main(argv: list[str] | None = None) -> str:
    """Run the benchmark, print the Markdown table and return it.

    Args:
        argv: command-line arguments (default: ``sys.argv[1:]``).
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-docs", type=int, default=20_000, help="documents per distribution")
    parser.add_argument("--max-seq-len", type=int, default=2048, help="pack capacity in tokens")
    parser.add_argument("--mean-len", type=float, default=300.0, help="mean document length")
    parser.add_argument("--sigma", type=float, default=1.0, help="log-normal sigma")
    parser.add_argument("--buffer-size", type=int, default=64, help="open packs for best_fit")
    parser.add_argument("--seed", type=int, default=0, help="seed of lengths and shuffle")
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this file")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    distributions = {
        f"log-normal (sigma={args.sigma:g})": lognormal_lengths(args.num_docs, args.mean_len, args.sigma, rng),
        "uniform": uniform_lengths(args.num_docs, args.mean_len, rng),
    }
    lines = [
        f"Packing {args.num_docs} documents into packs of {args.max_seq_len} tokens "
        f"(best_fit buffer_size={args.buffer_size}).",
        "",
        "| lengths | mean len | strategy | packs | non-padding share | tokens kept | docs/pack | packs/s |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for dist_name, lengths in distributions.items():
        for strategy in PACKING_STRATEGIES:
            r = measure(lengths, strategy, args.max_seq_len, args.buffer_size, args.seed)
            lines.append(
                f"| {dist_name} | {lengths.mean():.1f} | {strategy} | {r['packs']} | "
                f"{100 * r['non_padding']:.2f}% | {100 * r['tokens_kept']:.2f}% | "
                f"{r['docs_per_pack']:.2f} | {r['packs_per_s']:.0f} |"
            )
    table = "\n".join(lines)
    print(table)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table + "\n")
    return table


if __name__ == "__main__":
    main()
