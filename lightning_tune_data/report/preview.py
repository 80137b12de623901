"""A readable text rendering of batch rows: decoded documents, their boundaries and masked tokens."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lightning_tune_data.keys import (
    ATTENTION_MASK,
    DOCUMENT_IDS,
    IGNORE_INDEX,
    INPUT_IDS,
    LABELS,
    NEW_DOCUMENT,
    PROVENANCE,
    SOURCE,
)
from lightning_tune_data.tokenizers import Tokenizer

__all__ = ["LEGEND", "render_rows"]

#: How to read the rendered rows (printed above them in the report).
LEGEND = (
    "Each document starts on a new line with `[doc k | source | tokens]`; `<bos>`/`<eos>` are the "
    "document markers; text inside `«...»` is masked (no loss: prompt tokens); `(+N pad)` counts the "
    "padding positions at the end of the row."
)


def _special(tokenizer: Tokenizer) -> dict[int, str]:
    """``{token id: shown text}`` of the tokenizer's BOS, EOS and padding ids."""
    names = {}
    for attr, text in (("bos_id", "<bos>"), ("eos_id", "<eos>"), ("pad_id", "<pad>")):
        value = getattr(tokenizer, attr, None)
        if value is not None:
            names[int(value)] = text
    return names


def _decode_span(tokenizer: Tokenizer, ids: list[int], special: Mapping[int, str]) -> str:
    """``ids`` decoded, with special tokens shown by name."""
    out, run = [], []
    for token in ids:
        if token in special:
            if run:
                out.append(tokenizer.decode(run))
                run = []
            out.append(special[token])
        else:
            run.append(token)
    if run:
        out.append(tokenizer.decode(run))
    return "".join(out)


def render_rows(
    preview: Mapping[str, Any],
    tokenizer: Tokenizer,
    max_chars: int = 400,
    origins: Sequence[tuple[int, int]] | None = None,
) -> list[str]:
    """One text block per row of ``preview`` (see :class:`~.batches.BatchReport`).

    A token ``j`` of a document is *masked* when it is not the document's first token and the label
    before it (``labels[j - 1]``, which predicts it) is ``-100``.

    Args:
        preview: ``input_ids``, ``labels`` and ``document_ids`` or ``attention_mask`` rows, plus
            their ``provenance``.
        tokenizer: decodes the token ids.
        max_chars: longest text shown per document (the rest is elided with its token count).
        origins: ``(batch, row)`` of each row, shown in its header (``None``: rows of one batch,
            numbered from 0).
    """
    special = _special(tokenizer)
    provenance = preview[PROVENANCE]
    blocks = []
    entry = 0
    for row, ids in enumerate(preview[INPUT_IDS]):
        labels = preview[LABELS][row]
        if DOCUMENT_IDS in preview:
            docs = preview[DOCUMENT_IDS][row]
        else:
            docs = [0 if m else -1 for m in preview[ATTENTION_MASK][row]]
        lines = []
        position = 0
        while position < len(ids) and docs[position] >= 0:
            doc = docs[position]
            end = position
            while end < len(ids) and docs[end] == doc:
                end += 1
            source = provenance[SOURCE][entry] if entry < len(provenance[SOURCE]) else "?"
            continued = entry < len(provenance[SOURCE]) and not provenance[NEW_DOCUMENT][entry]
            entry += 1
            spans, current, masked = [], [], None
            for j in range(position, end):
                is_masked = j > position and labels[j - 1] == IGNORE_INDEX and ids[j] not in special
                if masked is not None and is_masked != masked:
                    spans.append((masked, current))
                    current = []
                masked = is_masked
                current.append(int(ids[j]))
            if current:
                spans.append((masked, current))
            text = "".join(f"«{_decode_span(tokenizer, s, special)}»" if m else _decode_span(tokenizer, s, special)
                           for m, s in spans).replace("\n", "⏎")
            if len(text) > max_chars:
                text = text[:max_chars] + f" …[{len(text) - max_chars} more characters]"
            note = ", continued" if continued else ""
            lines.append(f"[doc {doc} | {source} | {end - position} tokens{note}] {text}")
            position = end
        padding = len(ids) - position
        where = f"batch {origins[row][0]}, row {origins[row][1]}" if origins else f"row {row}"
        header = f"{where}: {len(lines)} document(s), {position} tokens" + (f" (+{padding} pad)" if padding else "")
        blocks.append("\n".join([header, *lines]))
    return blocks
