"""Regenerate the small datasets in ``examples/data/`` used by ``configs/quickstart.yaml``.

Deterministic and offline: prose comes from the docstrings of Python's standard library,
arithmetic and the word-reversal instructions are generated. Run from the repository root:

    python examples/make_quickstart_data.py
"""

from __future__ import annotations

import argparse
import csv
import importlib
import inspect
import json
import random
from pathlib import Path

STDLIB_MODULES = [
    "argparse", "asyncio", "collections", "contextlib", "csv", "dataclasses", "datetime", "decimal",
    "email", "fractions", "functools", "heapq", "http.client", "inspect", "itertools", "json", "logging",
    "pathlib", "pickle", "random", "re", "shutil", "socket", "statistics", "string", "subprocess",
    "tarfile", "textwrap", "threading", "typing", "unittest", "urllib.parse", "zipfile",
]


def prose_documents() -> list[str]:
    """Paragraphs of stdlib docstrings, deduplicated, in a stable order."""
    seen: set[str] = set()
    documents = []
    for module_name in STDLIB_MODULES:
        module = importlib.import_module(module_name)
        objects = [module] + [obj for _, obj in sorted(vars(module).items()) if inspect.isclass(obj) or inspect.isfunction(obj)]
        for obj in objects:
            doc = inspect.getdoc(obj) or ""
            for paragraph in doc.split("\n\n"):
                text = " ".join(paragraph.split())
                if 40 <= len(text) <= 600 and text not in seen:
                    seen.add(text)
                    documents.append(text)
    return documents


def arithmetic_documents(count: int, rng: random.Random) -> list[str]:
    lines = []
    for _ in range(count):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op = rng.choice("+-")
        lines.append(f"{a} {op} {b} = {a + b if op == '+' else a - b}")
    return lines


def reversal_rows(count: int, words: list[str], rng: random.Random) -> list[dict[str, str]]:
    rows = []
    for _ in range(count):
        phrase = " ".join(rng.sample(words, rng.randint(2, 5)))
        rows.append({"prompt": f"Reverse the words: {phrase}\nAnswer:", "completion": " " + " ".join(reversed(phrase.split()))})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "data")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)

    prose = prose_documents()
    rng.shuffle(prose)
    split = len(prose) // 10
    write_jsonl(args.out / "prose_train.jsonl", [{"text": t} for t in prose[split:]])
    write_jsonl(args.out / "prose_val.jsonl", [{"text": t} for t in prose[:split]])

    arithmetic = arithmetic_documents(4200, rng)
    write_jsonl(args.out / "arithmetic_train.jsonl", [{"text": t} for t in arithmetic[200:]])
    write_jsonl(args.out / "arithmetic_val.jsonl", [{"text": t} for t in arithmetic[:200]])

    words = sorted({w.strip(".,:;()'\"").lower() for t in prose for w in t.split() if w.isalpha() and 3 <= len(w) <= 8})
    with (args.out / "reverse_train.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["prompt", "completion"])
        writer.writeheader()
        writer.writerows(reversal_rows(2000, words, rng))
    print(f"wrote {len(prose)} prose, {len(arithmetic)} arithmetic and 2000 reversal rows to {args.out}")


if __name__ == "__main__":
    main()
