"""Matplotlib charts of the data report, each written to one PNG (headless ``Agg`` backend)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

__all__ = ["plot_efficiency", "plot_lengths", "plot_losses", "plot_mix", "plot_online_mixing", "plot_truncation"]


def _pyplot():  # noqa: ANN202 - matplotlib.pyplot module
    """``matplotlib.pyplot`` on the headless ``Agg`` backend (imported on first use: matplotlib is slow to import)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:  # noqa: ANN001 - matplotlib Figure
    """Write ``fig`` to ``path`` as a PNG, close it and return ``path``."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
    return path


def plot_mix(path: Path, x: Sequence[float], doc_shares: Mapping[str, Sequence[float]],
             token_shares: Mapping[str, Sequence[float]], targets: Mapping[str, float], mix_by: str | None,
             xlabel: str = "batches drawn") -> Path:
    """Realised share of documents (solid) and tokens (dashed) per source, with the target (dotted).

    Args:
        path: The PNG to write.
        x: The x position of each point (batches drawn, or logged steps).
        doc_shares: Per source, its cumulative share of documents at each point.
        token_shares: Per source, its cumulative share of tokens at each point.
        targets: Per source, its target weight (a dotted line).
        mix_by: What the weights are shares of, named in the title (``None``: not named).
        xlabel: Label of the x axis.

    Returns:
        ``path``.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, source in enumerate(doc_shares):
        color = colors[i % len(colors)]
        ax.plot(x, doc_shares[source], color=color, lw=2, label=f"{source}: documents")
        if source in token_shares:
            ax.plot(x, token_shares[source], color=color, lw=2, ls="--", label=f"{source}: tokens")
        if source in targets:
            ax.axhline(targets[source], color=color, lw=1, ls=":", alpha=0.8)
    ax.set_ylim(0, 1)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("share of the stream (cumulative)")
    weights = f"target weights as shares of {mix_by}" if mix_by else "target weights"
    ax.set_title(f"Realised vs target mix (dotted: {weights})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def plot_schedule(path: Path, steps: Sequence[float], realised: Mapping[str, Sequence[float]],
                  target_steps: Sequence[float], targets: Mapping[str, Sequence[float]]) -> Path:
    """A mixture schedule: per source its target weight over the run (dotted) and its realised
    share over the recent window of batches (solid).

    Args:
        path: The PNG to write.
        steps: The steps of the realised points.
        realised: Per source, its recent share at each of ``steps``.
        target_steps: The steps of the target points.
        targets: Per source, the schedule's weight at each of ``target_steps``.

    Returns:
        ``path``.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9.5, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, source in enumerate(targets):
        color = colors[i % len(colors)]
        ax.plot(target_steps, targets[source], color=color, lw=1.5, ls=":", label=f"{source}: target")
        if source in realised:
            ax.plot(steps, realised[source], color=color, lw=2, label=f"{source}: realised (recent)")
    ax.set_ylim(0, 1)
    ax.set_xlabel("step")
    ax.set_ylabel("share of the stream")
    ax.set_title("Mixture schedule: target vs realised share per source")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, path)


def plot_lengths(path: Path, lengths: Mapping[str, np.ndarray], max_seq_len: int) -> Path:
    """One histogram of document lengths per source, with ``max_seq_len`` marked.

    Args:
        path: The PNG to write.
        lengths: Per source, every document's length (sources without lengths are left out).
        max_seq_len: The longest sequence a batch row holds.

    Returns:
        ``path``.
    """
    plt = _pyplot()
    shown = {name: values for name, values in lengths.items() if len(values)}
    fig, axes = plt.subplots(len(shown) or 1, 1, figsize=(8, 2.2 * max(len(shown), 1)), squeeze=False,
                             sharex=True)
    longest = max([int(v.max()) for v in shown.values()] + [max_seq_len])
    bins = np.linspace(0, longest * 1.02, 80)  # the same bins for every source, so they compare
    for ax, (name, values) in zip(axes[:, 0], shown.items()):
        over = int((values > max_seq_len).sum())
        ax.hist(values, bins=bins, color="tab:blue", alpha=0.8)
        ax.axvline(max_seq_len, color="tab:red", lw=2, label=f"max_seq_len={max_seq_len}")
        ax.set_title(f"{name}: {len(values):,} documents, {over:,} ({100 * over / len(values):.1f}%) longer "
                     "than max_seq_len", fontsize=10)
        ax.set_ylabel("documents")
        ax.legend(fontsize=8)
    axes[-1, 0].set_xlabel("document length (tokens)")
    if not shown:
        axes[0, 0].text(0.5, 0.5, "no cached lengths (streaming sources)", ha="center", va="center")
    return _save(fig, path)


def plot_efficiency(path: Path, x: Sequence[float], real_fraction: Sequence[float], title: str,
                    xlabel: str = "batch") -> Path:
    """Share of positions holding real tokens (not padding), per batch / logged step.

    Args:
        path: The PNG to write.
        x: The x position of each point.
        real_fraction: Real tokens / positions at each point.
        title: The chart's title.
        xlabel: Label of the x axis.

    Returns:
        ``path``.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(x, real_fraction, marker="o", ms=3, lw=1, color="tab:green")
    if len(real_fraction):
        mean = float(np.mean(real_fraction))
        ax.axhline(mean, color="tab:green", ls=":", label=f"mean {100 * mean:.1f}%")
        ax.legend(fontsize=8)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("real tokens / positions")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_truncation(path: Path, sources: Sequence[str], cache_overlong: Mapping[str, float] | None,
                    truncated: Mapping[str, float], dropped: Mapping[str, float]) -> Path:
    """Per source: share of documents longer than max_seq_len (cache), truncated and dropped (stream).

    Args:
        path: The PNG to write.
        sources: Source names, one group of bars each.
        cache_overlong: Per source, the share of its cached documents longer than ``max_seq_len``
            (``None``: unknown, no bar).
        truncated: Per source, the share of its drawn documents that were truncated.
        dropped: Per source, dropped documents per drawn document.

    Returns:
        ``path``.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5))
    series = [("truncated (drawn)", truncated), ("dropped (drawn)", dropped)]
    if cache_overlong is not None:
        series.insert(0, ("longer than max_seq_len (cache)", cache_overlong))
    width = 0.8 / len(series)
    positions = np.arange(len(sources))
    for i, (label, values) in enumerate(series):
        heights = [100 * float(values.get(s, 0.0)) for s in sources]
        bars = ax.bar(positions + (i - (len(series) - 1) / 2) * width, heights, width, label=label)
        ax.bar_label(bars, fmt="%.1f%%", fontsize=7)
    ax.set_xticks(positions, sources)
    ax.set_ylabel("% of the source's documents")
    ax.set_title("Documents cut or dropped by the length policy")
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_losses(path: Path, steps: Mapping[str, Sequence[float]], losses: Mapping[str, Sequence[float]],
                sources: Sequence[str] = ()) -> Path:
    """Train loss per source over the logged steps; names not in ``sources`` are drawn as the overall loss.

    Args:
        path: The PNG to write.
        steps: Per name, the steps its loss was logged at.
        losses: Per name, the logged losses.
        sources: The train source names (empty: every name is drawn as a source).

    Returns:
        ``path``.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4))
    for name in losses:
        if name in sources or not sources:
            ax.plot(steps[name], losses[name], lw=1.5, label=name)
        else:
            ax.plot(steps[name], losses[name], lw=2, ls="--", color="black", label=f"{name} (overall)")
    ax.set_xlabel("step")
    ax.set_ylabel("train loss")
    ax.set_title("Train loss by source")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_online_mixing(path: Path, steps: Sequence[float], weights: Mapping[str, Sequence[float]],
                       losses: Mapping[str, Sequence[float]]) -> Path:
    """Online mixing: per source the controller's weight (top) and the interval's loss it saw
    (bottom) at each update.

    Args:
        path: The PNG to write.
        steps: The steps of the updates.
        weights: Per source, its weight at each update.
        losses: Per source, the interval's mean loss at each update (shorter when a source had no token).
    """
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for i, source in enumerate(weights):
        color = f"C{i}"
        top.plot(steps[: len(weights[source])], weights[source], color=color, lw=1.5, label=source)
        if losses.get(source):
            bottom.plot(steps[: len(losses[source])], losses[source], color=color, lw=1.5, label=source)
    top.set_ylabel("weight")
    top.set_title("Online mixing: the controller's weights and the losses it saw")
    top.grid(alpha=0.3)
    top.legend(fontsize=8)
    bottom.set_xlabel("step")
    bottom.set_ylabel("interval loss")
    bottom.grid(alpha=0.3)
    return _save(fig, path)
