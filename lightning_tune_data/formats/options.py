"""What a format reader needs to know beyond the files: the options of a tokenized source.

Some formats do not record their token dtype (nanoGPT and Dolma files are raw ids) or where
documents end (an EOS or BOS delimiter id). These come from the manager's options, or from the
tokenizer when one was given; a check against the tokenizer's vocabulary needs its size.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["FormatOptions"]


@dataclass(frozen=True)
class FormatOptions:
    """How to read one corpus.

    Args:
        description: names the source in errors.
        local_dir: this node's folder for kept scans, decoded files and copies.
        dtype: the token dtype where the format does not record it (``None``: the format's default).
        eos_id: the id that ends a document (Dolma, nanoGPT) or starts one (llm.c), where the
            format has no index.
        vocab_size: ids must be below it (``None``: not checked).
        column: the token column of an MDS or LitData dataset (``None``: the first integer array).
    """

    description: str
    local_dir: Path
    dtype: str | None = None
    eos_id: int | None = None
    vocab_size: int | None = None
    column: str | None = None

    def need_eos(self, format: str) -> int:
        """The delimiter id a format without an index needs.

        Raises:
            ValueError: none was given and no tokenizer has one.
        """
        if self.eos_id is None:
            raise ValueError(
                f"{self.description}: {format} files mark documents only by a delimiter token; set eos_id "
                "(e.g. eos_id: 50256 for GPT-2 ids) or give the datamodule the tokenizer that wrote them."
            )
        return int(self.eos_id)

    def check_recorded_dtype(self, dtype: str, where: str, why: str = "") -> None:
        """Refuse a ``dtype`` option that contradicts the dtype a file records.

        Args:
            dtype: the dtype ``where`` records.
            where: the file (its URL) that records it.
            why: appended to the fix, e.g. ``" (the index says it)"``.

        Raises:
            ValueError: ``dtype`` was given and differs.
        """
        if self.dtype is not None and self.dtype != dtype:
            raise ValueError(f"{self.description}: dtype={self.dtype!r} but {where} records {dtype}; remove the dtype "
                             f"option{why}.")
