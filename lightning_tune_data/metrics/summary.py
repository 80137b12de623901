"""Human-readable summaries of the data mix: the end-of-fit table, the notes that explain its numbers,
and the TensorBoard chart layout."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["format_mix_table", "format_percent", "held_back_note", "mix_notes", "no_target_notes",
           "tensorboard_layout"]

#: Smallest possible gap (as a share) between the trained-on and the drawn mix worth a note: the
#: table shows one decimal of a percent.
HELD_BACK_NOTE_SHARE = 0.0005


def format_percent(value: Any) -> str:
    """A share as a percentage with one decimal (``0.25`` -> ``"25.0%"``), ``"-"`` when unknown.

    Args:
        value: A fraction, or ``None``.
    """
    return "-" if value is None else f"{100 * float(value):.1f}%"


def format_mix_table(metrics: Mapping[str, Mapping[str, Any]], stream_name: str = "all",
                     mix_by: str = "documents", notes: Sequence[str] = ()) -> str:
    """A small text table of realised vs target mix per source, with notes explaining its numbers.

    Args:
        metrics: ``{name: {"metrics": {...}}}`` as :class:`DatasetMetricsAggregator` computes it.
        stream_name: the whole-stream group (left out of the rows).
        mix_by: what the weights are shares of (``"documents"`` or ``"tokens"``); named in the header.
        notes: lines printed under the table (e.g. :func:`mix_notes`).

    Returns:
        The table, one line per source, then the notes, ending without a newline.
    """
    header = ("source", "target", "documents", "tokens", "recent docs", "recent tokens", "truncated", "dropped",
              "no target")
    rows = [header]
    for name, entry in metrics.items():
        if name == stream_name:
            continue
        m = entry.get("metrics", {})
        rows.append((
            name, format_percent(m.get("target_weight")), format_percent(m.get("share")),
            format_percent(m.get("token_share")), format_percent(m.get("window_share")),
            format_percent(m.get("window_token_share")),
            str(int(m.get("truncated_docs", 0))), str(int(m.get("dropped_docs", 0))),
            str(int(m.get("no_target_docs", 0))),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [f"Data mix (weights are shares of {mix_by}; 'recent' = the last window of batches):"]
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(width) if i == 0 else cell.rjust(width)
                               for i, (cell, width) in enumerate(zip(row, widths))))
        if index == 0:
            lines.append("  ".join("-" * width for width in widths))
    lines.extend(f"Note: {note}" for note in notes)
    return "\n".join(lines)


def no_target_notes(metrics: Mapping[str, Mapping[str, Any]], stream_name: str = "all") -> list[str]:
    """One line per source whose documents reached the model with no target token.

    Args:
        metrics: ``{name: {"metrics": {...}}}`` as :class:`DatasetMetricsAggregator` computes it.
        stream_name: the whole-stream group (not a source).
    """
    notes = []
    for name, entry in metrics.items():
        m = entry.get("metrics", {})
        empty = int(m.get("no_target_docs", 0))
        if name == stream_name or not empty:
            continue
        notes.append(
            f"'{name}': {empty:,} of {int(m.get('samples_seen', 0)):,} documents trained on had no target token (every "
            f"label masked, e.g. a prompt cut at max_seq_len before its completion); they took "
            f"{format_percent(m.get('token_share'))} of the tokens and added nothing to the loss. Raise max_seq_len or "
            "shorten the prompts."
        )
    return notes


def held_back_note(packing: str | None, open_packs: int, max_seq_len: int, shards: int,
                   tokens_seen: int) -> str | None:
    """Why the realised shares of a packed stream trail the targets early in a run, with how far they can.

    The mixer draws documents on target, but a packer holds the documents of its open packs until
    they fill (``best_fit`` keeps up to ``packing_buffer_size`` of them, the others one): those
    documents are drawn but not trained on yet, and which ones wait depends on their lengths. So
    the trained-on shares can differ from the targets by up to ``held / tokens_seen``, a gap that
    shrinks as the run goes on. ``None`` when it cannot show in the table (or without packing).

    Args:
        packing: the packing strategy's name, or ``None``.
        open_packs: packs one packer may hold open.
        max_seq_len: tokens a pack holds at most.
        shards: packers in the run (ranks x dataloader workers, at least one per rank).
        tokens_seen: tokens the model trained on.
    """
    if packing is None or tokens_seen <= 0:
        return None
    held = open_packs * max_seq_len * shards
    if held / tokens_seen < HELD_BACK_NOTE_SHARE:
        return None
    packs = f"up to {open_packs} open packs" if open_packs > 1 else "one open pack"
    return (
        f"{packing} packing holds documents in {packs} per worker until they fill: up to {held:,} tokens drawn from "
        f"the sources but not trained on yet, {format_percent(held / tokens_seen)} of the {tokens_seen:,} tokens "
        "trained on so far. Which documents wait depends on their lengths, so the shares above can differ from the "
        "targets by up to that much; the gap shrinks as training goes on."
    )


def mix_notes(metrics: Mapping[str, Mapping[str, Any]], stream_name: str, datamodule: Any, world_size: int) -> list[str]:
    """The notes under the end-of-fit table: sources with no target token, and packs held back.

    Args:
        metrics: ``{name: {"metrics": {...}}}`` as :class:`DatasetMetricsAggregator` computes it.
        stream_name: the whole-stream group.
        datamodule: the Trainer's datamodule (its ``packing``, ``packing_buffer_size``,
            ``max_seq_len`` and ``num_workers`` are read when it has them), or ``None``.
        world_size: ranks in the run.
    """
    notes = no_target_notes(metrics, stream_name)
    packing = getattr(datamodule, "packing", None)
    max_seq_len = getattr(datamodule, "max_seq_len", None)
    if packing is not None and max_seq_len is not None:
        open_packs = int(getattr(datamodule, "packing_buffer_size", 1)) if packing == "best_fit" else 1
        shards = max(1, int(world_size)) * max(1, int(getattr(datamodule, "num_workers", 0) or 0))
        tokens = int(metrics.get(stream_name, {}).get("metrics", {}).get("tokens_seen", 0))
        note = held_back_note(packing, open_packs, int(max_seq_len), shards, tokens)
        if note is not None:
            notes.append(note)
    return notes


def tensorboard_layout(prefix: str = "dataset") -> dict[str, dict[str, list]]:
    """A TensorBoard custom-scalars layout: every source's shares on one chart per metric.

    For ``SummaryWriter.add_custom_scalars``: charts match tags by regular expression, so sources
    added later appear on the same charts.

    Args:
        prefix: First path component of the dataset metrics' tags.
    """
    def chart(metric: str) -> list:
        """One chart with every source's ``metric``."""
        return ["Multiline", [rf"^{prefix}/[^/]+/{metric}$"]]

    return {
        "Data mix": {
            "share of documents": chart("share"),
            "share of tokens": chart("token_share"),
            "recent share of documents": chart("window_share"),
            "recent share of tokens": chart("window_token_share"),
            "target weight": chart("target_weight"),
        },
        "Loss by source": {"train loss": ["Multiline", [r"^train/[^/]+/loss$"]]},
        "Length policy": {
            "truncated documents": chart("truncated_docs"),
            "dropped documents": chart("dropped_docs"),
            "documents with no target": chart("no_target_docs"),
        },
    }
