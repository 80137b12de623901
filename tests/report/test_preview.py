"""render_rows: batch rows as readable text, with document boundaries, masked prompt tokens and padding."""

from __future__ import annotations

import numpy as np

from lightning_tune_data import ByteTokenizer, PaddedCollator
from lightning_tune_data.keys import IGNORE_INDEX
from lightning_tune_data.report.preview import LEGEND, render_rows

TOKENIZER = ByteTokenizer()


def test_preview_marks_masked_prompt_tokens_and_padding() -> None:
    tokenizer = ByteTokenizer()
    prompt, completion = tokenizer.encode("abc="), tokenizer.encode("cba")
    ids = [tokenizer.bos_id, *prompt, *completion, tokenizer.eos_id]
    mask = [False] * (1 + len(prompt)) + [True] * (len(completion) + 1)
    batch = PaddedCollator(pad_id=tokenizer.pad_id)([
        {"input_ids": np.array(ids), "loss_mask": np.array(mask), "source": "reverse", "epoch": 0},
        {"input_ids": np.array([tokenizer.bos_id, *tokenizer.encode("hi"), tokenizer.eos_id]), "source": "lm",
         "epoch": 0},
    ])
    preview = {k: batch[k].tolist() for k in ("input_ids", "labels", "attention_mask")}
    preview["provenance"] = batch["provenance"]
    blocks = render_rows(preview, tokenizer)
    assert blocks[0] == "row 0: 1 document(s), 9 tokens\n[doc 0 | reverse | 9 tokens] <bos>«abc=»cba<eos>"
    assert blocks[1] == "row 1: 1 document(s), 4 tokens (+5 pad)\n[doc 0 | lm | 4 tokens] <bos>hi<eos>"


def packed_row(*documents: list[int], length: int) -> tuple[list[int], list[int]]:
    """``input_ids`` and ``document_ids`` of one packed row holding ``documents``, padded to ``length``."""
    ids = [token for document in documents for token in document]
    doc_ids = [index for index, document in enumerate(documents) for _ in document]
    padding = length - len(ids)
    return ids + [TOKENIZER.pad_id] * padding, doc_ids + [-1] * padding


def test_packed_rows_show_each_document_with_its_source_and_continued_pieces() -> None:
    tail = TOKENIZER.encode("rest") + [TOKENIZER.eos_id]
    whole = [TOKENIZER.bos_id, *TOKENIZER.encode("new line\nhere"), TOKENIZER.eos_id]
    first_ids, first_docs = packed_row(tail, whole, length=24)
    second_ids, second_docs = packed_row([TOKENIZER.bos_id, *TOKENIZER.encode("x")], length=24)
    preview = {
        "input_ids": [first_ids, second_ids],
        "labels": [first_ids[1:] + [IGNORE_INDEX], second_ids[1:] + [IGNORE_INDEX]],
        "document_ids": [first_docs, second_docs],
        "provenance": {"source": ["prose", "code", "math"], "new_document": [False, True, True]},
    }
    blocks = render_rows(preview, TOKENIZER)
    assert blocks[0].splitlines() == [
        f"row 0: 2 document(s), {len(tail) + len(whole)} tokens (+{24 - len(tail) - len(whole)} pad)",
        f"[doc 0 | prose | {len(tail)} tokens, continued] rest<eos>",
        f"[doc 1 | code | {len(whole)} tokens] <bos>new line⏎here<eos>",
    ]
    assert blocks[1].splitlines()[1] == "[doc 0 | math | 2 tokens] <bos>x"


def test_long_documents_are_elided_with_the_count_of_characters_left_out() -> None:
    ids = [TOKENIZER.bos_id, *TOKENIZER.encode("a" * 30), TOKENIZER.eos_id]
    preview = {"input_ids": [ids], "labels": [ids[1:] + [IGNORE_INDEX]], "attention_mask": [[1] * len(ids)],
               "provenance": {"source": ["lm"], "new_document": [True]}}
    [block] = render_rows(preview, TOKENIZER, max_chars=10)
    assert block.splitlines()[1] == "[doc 0 | lm | 32 tokens] <bos>aaaaa …[30 more characters]"  # 40 characters shown as 10


def test_documents_beyond_the_provenance_are_shown_with_an_unknown_source() -> None:
    ids = [TOKENIZER.bos_id, *TOKENIZER.encode("ok"), TOKENIZER.eos_id]
    preview = {"input_ids": [ids], "labels": [ids[1:] + [IGNORE_INDEX]], "document_ids": [[0] * len(ids)],
               "provenance": {"source": [], "new_document": []}}
    assert render_rows(preview, TOKENIZER) == ["row 0: 1 document(s), 4 tokens\n[doc 0 | ? | 4 tokens] <bos>ok<eos>"]
    assert "«...»" in LEGEND and "(+N pad)" in LEGEND
