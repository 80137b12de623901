"""Benchmark 5: packing efficiency (wraps ``benchmarks/packing_efficiency.py``).

Uses that script's ``measure()`` (one shuffled pass of ``--packing-docs`` documents through
``IterablePackedDataset``) for ``greedy``, ``best_fit`` (buffer 64) and ``concat`` on log-normal
(mean 300, sigma 1) and uniform (1..599) document lengths, packs of 2048 tokens.

Figure: non-padding share (tokens in packs / (packs x 2048)). Baseline: no packing, i.e. the
same documents in the same shuffled order, batches of 16 padded to their longest document
(truncated at 2048), as the ``PaddedCollator`` would. The ``best_fit`` log-normal row is checked
against the figure ``packing/strategies/best_fit.py`` documents (>= 99 %). The script itself still runs alone:
``python benchmarks/packing_efficiency.py``.
"""

from __future__ import annotations

import numpy as np

from common import Result, log
from packing_efficiency import lognormal_lengths, measure, uniform_lengths

MAX_SEQ_LEN = 2048
BUFFER_SIZE = 64
PAD_BATCH = 16


def padded_share(lengths: np.ndarray, seed: int, batch_size: int = PAD_BATCH, max_seq_len: int = MAX_SEQ_LEN) -> float:
    """Non-padding share of unpacked batches: shuffled documents, each batch padded to its longest."""
    order = np.random.default_rng(seed).permutation(len(lengths))
    kept = np.minimum(lengths[order], max_seq_len)
    usable = len(kept) // batch_size * batch_size
    batches = kept[:usable].reshape(-1, batch_size)
    return float(batches.sum() / (batches.max(axis=1) * batch_size).sum())


def run(ctx) -> list[Result]:
    from lightning_tune_data.packing.packer import PACKING_STRATEGIES

    rng = np.random.default_rng(0)
    distributions = {
        "log-normal mean 300": lognormal_lengths(ctx.packing_docs, 300.0, 1.0, rng),
        "uniform 1..599": uniform_lengths(ctx.packing_docs, 300.0, rng),
    }
    results = []
    for dist_name, lengths in distributions.items():
        base = padded_share(lengths, seed=0)
        for strategy in PACKING_STRATEGIES:
            r = measure(lengths, strategy, MAX_SEQ_LEN, BUFFER_SIZE, seed=0)
            check = strategy == "best_fit" and dist_name.startswith("log-normal")
            results.append(Result(
                "5 packing", f"{dist_name}, {ctx.packing_docs:,} docs, {strategy}", "non-padding share",
                100 * r["non_padding"], "%", f"unpacked, batches of {PAD_BATCH} padded to longest", 100 * base,
                ">= 99% (packing.py docstring)" if check else "", (r["non_padding"] >= 0.99) if check else None,
                note=(f"tokens kept {100 * r['tokens_kept']:.2f}%, {r['docs_per_pack']:.2f} docs/pack, "
                      f"{r['packs_per_s']:.0f} packs/s, {r['truncated']} truncated"),
            ))
        log(f"packing: {dist_name} done")
    return results
