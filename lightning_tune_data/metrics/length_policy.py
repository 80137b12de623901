"""What the length policy did to each source's documents, and what it left the loss, per source.

Counted per source: documents truncated or dropped for being longer than ``max_seq_len``, the
tokens cut, documents the model saw with no target token (all their labels masked, e.g. a prompt
that fills ``max_seq_len`` so truncation cut the whole completion: they add nothing to the loss)
and the target tokens trained on. :class:`LengthPolicyCounts` holds plain ints only, so the counts
of several ranks merge by summing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

__all__ = ["LENGTH_POLICY_METRICS", "LengthPolicyCounts", "document_targets"]

#: Counter names reported per source (and for the whole stream), in the order a state lists them.
LENGTH_POLICY_METRICS = ("truncated_docs", "truncated_tokens", "dropped_docs", "no_target_docs", "target_tokens")


def document_targets(targets: Sequence[int], new_document: Sequence[bool]) -> list[int | None]:
    """Per piece that starts its document, the target labels of the document's pieces in this batch.

    A document split across packs (``concat``) continues in the first piece of the next row
    (``new_document=False``), so its targets are added up from there. ``None`` for continuation
    pieces, and for a document without targets so far that reaches the end of a batch which holds
    continuations (documents are split there, so it may go on, with targets, in a later batch).

    Args:
        targets: target labels of each piece, in batch order.
        new_document: whether each piece starts its document.
    """
    count = len(targets)
    splits = not all(new_document)
    out: list[int | None] = [None] * count
    for i in range(count):
        if not new_document[i]:
            continue
        total, last = int(targets[i]), i
        while total == 0 and last + 1 < count and not new_document[last + 1]:
            last += 1
            total += int(targets[last])
        if total or not (splits and last == count - 1):
            out[i] = total
    return out


def _padded(values: Sequence[int]) -> list[int]:
    """A saved count list at the current length (a state saved before a counter existed lacks it)."""
    counts = [int(value) for value in values][: len(LENGTH_POLICY_METRICS)]
    return counts + [0] * (len(LENGTH_POLICY_METRICS) - len(counts))


class LengthPolicyCounts:
    """Per-source ``truncated_docs``, ``truncated_tokens``, ``dropped_docs``, ``no_target_docs`` and
    ``target_tokens``.

    Documents are counted on their first piece only (``new_document``), so a document split over
    several packs is counted once; a split document (``concat``) counts as ``no_target_docs`` when
    none of its pieces in the batch has a target (:func:`document_targets`; one that may go on in
    a later batch is not counted). ``target_tokens`` sums every piece's targets.
    """

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}

    def add(self, sources: Sequence[str], truncated: Sequence[int], dropped: Sequence[int],
            new_document: Sequence[bool], targets: Sequence[int] | None = None) -> None:
        """Count one batch's document pieces.

        Args:
            sources: Source of each piece.
            truncated: Tokens the policy cut from each piece's document.
            dropped: Documents the policy dropped just before each piece's document.
            new_document: Whether each piece starts its document (only those count as documents).
            targets: Target labels of each piece (the collators' ``target_tokens``); ``None``
                when the batch does not say, and then neither target counter moves.
        """
        width = len(LENGTH_POLICY_METRICS)
        documents = None if targets is None else document_targets(targets, new_document)
        for i, (source, cut, gone, new) in enumerate(zip(sources, truncated, dropped, new_document)):
            if not new and targets is None:
                continue
            entry = self.counts.get(source)
            if entry is None:
                entry = self.counts[source] = [0] * width
            if targets is not None:
                entry[4] += int(targets[i])
                entry[3] += int(documents[i] == 0)
            if not new:
                continue
            entry[0] += int(cut > 0)
            entry[1] += int(cut)
            entry[2] += int(gone)

    @staticmethod
    def merged(states: Iterable[Mapping[str, Sequence[int]]]) -> dict[str, dict[str, int]]:
        """``{source: {metric: summed count}}`` over several ranks' :meth:`state_dict`.

        Args:
            states: One state per rank.
        """
        out = LengthPolicyCounts.folded(states)
        return {source: dict(zip(LENGTH_POLICY_METRICS, values)) for source, values in out.items()}

    @staticmethod
    def folded(states: Iterable[Mapping[str, Sequence[int]]]) -> dict[str, list[int]]:
        """One state equal to several ranks' states together (counts summed per source).

        Args:
            states: :meth:`state_dict` of each old rank (a missing state is ``{}``).
        """
        folded: dict[str, list[int]] = {}
        for state in states:
            for source, values in state.items():
                total = folded.setdefault(source, [0] * len(LENGTH_POLICY_METRICS))
                folded[source] = [a + b for a, b in zip(total, _padded(values))]
        return folded

    def state_dict(self) -> dict[str, list[int]]:
        """``{source: [truncated_docs, truncated_tokens, dropped_docs, no_target_docs, target_tokens]}``."""
        return {source: list(values) for source, values in self.counts.items()}

    def load_state_dict(self, state_dict: Mapping[str, Sequence[int]]) -> None:
        """Restore counts saved by :meth:`state_dict` (replacing the current ones).

        Args:
            state_dict: What :meth:`state_dict` returned (a state without the target counters
                restores them as 0).
        """
        self.counts = {str(s): _padded(values) for s, values in state_dict.items()}
