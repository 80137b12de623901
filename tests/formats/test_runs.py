"""Token runs at any byte position gathered into one array, as a per-run loop would."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_tune_data.formats import runs
from lightning_tune_data.formats.runs import gather_runs, read_u32_at


@pytest.mark.parametrize("mask_below", [0, 1 << 20])  # runs joined slice by slice, or selected by the byte mask
@pytest.mark.parametrize("dtype", ["uint16", "int32", "int64"])
def test_runs_at_every_alignment_come_out_as_a_loop_reads_them(dtype, mask_below, monkeypatch) -> None:
    monkeypatch.setattr(runs, "_MASK_BYTES_PER_RUN", mask_below)
    rng = np.random.default_rng(0)
    data, starts, counts, want = bytearray(), [], [], []
    for count in [0, *rng.integers(0, 40, size=60).tolist(), 120]:
        data += bytes(rng.integers(0, 256, size=int(rng.integers(0, 7)), dtype=np.uint8))  # a header of any length
        ids = rng.integers(0, 60000, size=count).astype(dtype)
        starts.append(len(data))
        counts.append(count)
        data += ids.tobytes()
        want.append(ids)
    got = gather_runs(bytes(data), np.array(starts), np.array(counts), dtype)
    assert got.dtype == np.dtype(dtype) and np.array_equal(got, np.concatenate(want))
    loop = [np.frombuffer(bytes(data), dtype, c, s) for s, c in zip(starts, counts)]
    assert np.array_equal(got, np.concatenate(loop))


def test_sizes_are_read_at_unaligned_positions_and_a_run_past_the_end_is_refused() -> None:
    data = b"\x00" + np.array([7, 1 << 20], "<u4").tobytes()
    assert read_u32_at(data, np.array([1, 5])).tolist() == [7, 1 << 20]
    with pytest.raises(ValueError, match="beyond the 9 bytes"):
        read_u32_at(data, np.array([6]))
    with pytest.raises(ValueError, match="reaches beyond the 9 bytes"):
        gather_runs(data, np.array([1]), np.array([3]), "int32")
    with pytest.raises(ValueError, match="or into the next one"):
        gather_runs(data, np.array([1, 3]), np.array([1, 1]), "int32")
    assert gather_runs(data, np.zeros(0), np.zeros(0), "int32").tolist() == []
