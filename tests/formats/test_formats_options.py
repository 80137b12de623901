"""Format options: the delimiter a format without an index needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from lightning_tune_data.formats.options import FormatOptions


def test_a_missing_delimiter_says_how_to_give_one(tmp_path: Path) -> None:
    assert FormatOptions("source 'x'", tmp_path, eos_id=7).need_eos("nanogpt") == 7
    with pytest.raises(ValueError, match=r"source 'x': nanogpt files mark documents only by a delimiter token; set eos_id"):
        FormatOptions("source 'x'", tmp_path).need_eos("nanogpt")
