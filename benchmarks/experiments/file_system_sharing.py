"""Does torch's ``file_system`` sharing strategy leave shared memory behind when a worker is killed?

Dataloader workers that build batches in ``file_system`` shared memory (named segments in
``/dev/shm`` instead of file descriptors passed through a socket) were measured to deliver about
1.3-1.7x the full batches per second of the default ``file_descriptor`` strategy on 2 cores. This
checks the other condition for using it: two workers build 1 MB segments, one is killed with
``SIGKILL``, the loader fails, every batch is released, and the segments left in ``/dev/shm`` are
counted after the process is done with them (then removed, so the machine is left clean).

    python benchmarks/experiments/file_system_sharing.py

Result on this machine, three runs: 3, 5 and 0 segments left behind with ``file_system`` (those a
worker had queued when the loader shut down: it depends on the moment of the kill); none with
``file_descriptor``. The train loader does not use it.
"""

from __future__ import annotations

import gc
import glob
import os
import signal
import time

import torch
import torch.multiprocessing as torch_multiprocessing
from torch.utils.data import DataLoader, IterableDataset


def use_file_system(_: int) -> None:
    torch_multiprocessing.set_sharing_strategy("file_system")


class Segments(IterableDataset):
    """Endless 1 MB tensors built in shared memory, as the collators build a batch."""

    def __iter__(self):
        while True:
            empty = torch.empty(0, dtype=torch.uint8)
            yield empty.new(empty._typed_storage()._new_shared(1 << 20)).fill_(1)


def left_behind(strategy_init) -> list[str]:
    before = set(glob.glob("/dev/shm/torch_*"))
    loader = DataLoader(Segments(), batch_size=None, num_workers=2, worker_init_fn=strategy_init, prefetch_factor=4)
    batches = iter(loader)
    held = [next(batches) for _ in range(5)]
    os.kill(batches._workers[0].pid, signal.SIGKILL)
    try:
        for _ in range(50):
            held.append(next(batches))
    except (RuntimeError, OSError):
        pass  # "DataLoader worker ... exited unexpectedly", or its socket reset mid-handshake
    del batches, loader
    held.clear()
    gc.collect()
    time.sleep(1)
    return sorted(set(glob.glob("/dev/shm/torch_*")) - before)


if __name__ == "__main__":
    leaked = left_behind(use_file_system)
    print(f"file_system: {len(leaked)} segments left in /dev/shm")
    for path in leaked:
        os.remove(path)
    print(f"file_descriptor: {len(left_behind(None))} segments left in /dev/shm")
