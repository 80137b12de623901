"""The planned-gather design for packed `concat` rows, as a stand-alone NumPy sketch (no state, no
provenance): shuffled documents of a memory-mapped uint16 token array cut into `[8, 2048]` rows with
one fancy-index gather, labels and positions computed from the segment boundaries, against the blocks
reader (random 2049-token windows) and a per-document join of the same ids, in one process.

    python benchmarks/experiments/sketch_planned_gather.py      # results: benchmarks/results/planned-gather-sketch.md
"""
import time
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parents[1] / ".data" / "sketch_tokens.npy"
DATA.parent.mkdir(exist_ok=True)
rng = np.random.default_rng(0)
N = 200_000
lengths = np.clip(rng.lognormal(5.4, 0.8, N).astype(np.int64), 8, 8000)
offsets = np.zeros(N + 1, np.int64); np.cumsum(lengths, out=offsets[1:])
tokens = rng.integers(0, 50000, offsets[-1]).astype(np.uint16)
np.save(str(DATA), tokens); tokens = np.load(str(DATA), mmap_mode="r")
B, S = 8, 2048; W = B * (S + 1)
perm = rng.permutation(N)
def blocks(n):
    total = offsets[-1] - (S + 1)
    for _ in range(n):
        starts = rng.integers(0, total, B)
        x = np.stack([tokens[s:s + S + 1] for s in starts]).astype(np.int64)
        yield x[:, :-1], x[:, 1:]
def joined(n):
    pos = 0
    for _ in range(n):
        parts = []; need = B * S; got = 0
        while got < need:
            d = perm[pos % N]; pos += 1
            parts.append(np.asarray(tokens[offsets[d]:offsets[d + 1]])); got += lengths[d]
        ids = np.concatenate(parts)[:need].astype(np.int64).reshape(B, S)
        yield ids
def gather(n):
    plen = lengths[perm]; cum = np.zeros(N + 1, np.int64); np.cumsum(plen, out=cum[1:])
    starts_p = offsets[perm]
    pos = 0
    for _ in range(n):
        a, b = pos, pos + B * S
        i0 = np.searchsorted(cum, a, side="right") - 1
        i1 = np.searchsorted(cum, b, side="left")
        seg_len = np.minimum(cum[i0 + 1:i1 + 1], b) - np.maximum(cum[i0:i1], a)
        seg_src = starts_p[i0:i1] + (np.maximum(cum[i0:i1], a) - cum[i0:i1])
        seg_out = np.maximum(cum[i0:i1], a) - a
        index = np.repeat(seg_src - seg_out, seg_len) + np.arange(B * S)
        ids = tokens[index].astype(np.int64).reshape(B, S)
        labels = np.empty_like(ids); flat = labels.reshape(-1); flat[:-1] = ids.reshape(-1)[1:]; flat[-1] = -100
        ends = (seg_out + seg_len - 1); flat[ends[ends < B * S]] = -100
        positions = (np.arange(B * S) - np.repeat(seg_out, seg_len)).reshape(B, S)
        docids = np.repeat(np.arange(len(seg_len)), seg_len).reshape(B, S)
        pos = b
        yield ids, labels, positions, docids
for name, fn in (("blocks", blocks), ("join", joined), ("gather", gather)):
    best = []
    for r in range(5):
        it = fn(400); t = time.perf_counter()
        for _ in it: pass
        best.append((time.perf_counter() - t) / 400)
    m = sorted(best)[2]
    print(f"{name}: {m*1e6:.1f} us/batch, {B*S/m/1e6:.0f} Mtok/s")
