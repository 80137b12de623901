"""Small sources on disk for the manager tests: rows in each file type, the tokens they become."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lightning_tune_data.preprocess import tokenize_text
from lightning_tune_data.tokenizers import ByteTokenizer

TOK = ByteTokenizer()
BOS, EOS = TOK.bos_id, TOK.eos_id
TEXTS = [f"doc {i}: " + "word " * (i % 5) for i in range(20)]
#: Calls of :func:`counting_tokenize` (batches and rows), to prove cache hits do no work.
CALLS = {"batches": 0, "rows": 0}


def counting_tokenize(examples: dict[str, list], tokenizer: ByteTokenizer, text_column: str = "text") -> dict[str, list]:
    CALLS["batches"] += 1
    CALLS["rows"] += len(examples[text_column])
    return tokenize_text(examples, tokenizer, text_column=text_column)


class OtherByteTokenizer(ByteTokenizer):
    """Same ids, different identity: must never share a cache with ByteTokenizer."""

    @property
    def identity(self) -> str:
        return "OtherByteTokenizer:v1"


def expected_ids(text: str, bos: bool = True, eos: bool = True) -> list[int]:
    return ([BOS] if bos else []) + list(text.encode("utf-8")) + ([EOS] if eos else [])


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_csv(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_text(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(row["text"] + "\n" for row in rows), encoding="utf-8")
    return path


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", [{"text": t, "id": i} for i, t in enumerate(TEXTS)])


def token_rows(dataset: datasets.Dataset, column: str = "input_ids") -> list[list]:
    return [list(row) for row in dataset[column]]
