"""The weights a mixture controller published, in shared memory: :class:`WeightVersions`.

Version 0 is the run's starting weights; version ``k`` is what the controller returned at its
``k``-th update. The main process appends versions (:meth:`WeightVersions.publish`, a few
microseconds, never waiting); every dataloader worker reads them (:meth:`WeightVersions.get`). The
table is a shared-memory tensor created in the main process before the loader's workers start,
so a forked or spawned worker sees every version the main process publishes later.

A worker that needs a version not published yet waits for it, polling with short sleeps. It never
guesses: it raises when its main process is gone (no longer its parent, and gone) or after
:attr:`WeightVersions.wait_timeout` seconds. In the main process itself (``num_workers=0``) a
missing version is an error at once: the main process would be waiting for itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import torch

__all__ = ["WeightVersions", "WAIT_TIMEOUT_S"]

#: How long a worker waits for a version before it gives up (seconds).
WAIT_TIMEOUT_S = 600.0
#: First and longest sleep between two looks at the table (seconds).
_FIRST_SLEEP, _LONGEST_SLEEP = 0.0005, 0.02


class WeightVersions:
    """A growing table of weight versions in shared memory (see the module docstring).

    Args:
        names: the sources, in the mixture's order.
        initial: version 0, in ``names`` order.
        capacity: most versions the table holds (version 0 included).
        what: how the versions are configured, named by the errors (``"TextDataModule.mix_update_every=100"``).
    """

    def __init__(self, names: Sequence[str], initial: Sequence[float], capacity: int, what: str = "") -> None:
        if capacity < 1:
            raise ValueError(f"WeightVersions: capacity must be >= 1, got {capacity}.")
        self.names = list(names)
        self.what = what
        k = len(self.names)
        # Column k of a row holds its version number + 1, written after its weights: a reader that
        # sees it also sees the weights.
        self.table = torch.zeros(capacity, k + 1, dtype=torch.float64).share_memory_()
        self.count = torch.zeros(1, dtype=torch.int64).share_memory_()
        self.owner = os.getpid()
        self.wait_timeout = WAIT_TIMEOUT_S
        self.publish(initial)

    @property
    def capacity(self) -> int:
        """Most versions the table holds."""
        return int(self.table.shape[0])

    def __len__(self) -> int:
        return int(self.count[0])

    def publish(self, weights: Sequence[float]) -> int:
        """Append a version (main process only); returns its number.

        Args:
            weights: the version's weights, in ``names`` order.
        """
        version = len(self)
        if version >= self.capacity:
            raise RuntimeError(f"WeightVersions: all {self.capacity} versions are used; {self.what}: update less "
                               "often (a larger mix_update_every) or set the Trainer's max_steps so the table is sized.")
        row = self.table[version]
        row[: len(self.names)] = torch.tensor([float(w) for w in weights], dtype=torch.float64)
        row[len(self.names)] = version + 1
        self.count[0] = version + 1
        return version

    def load(self, versions: Sequence[Sequence[float]]) -> None:
        """Replace every version after 0 with ``versions`` (a resumed run's history; before workers start).

        Args:
            versions: versions 1, 2, ... in order.
        """
        self.table[1:].zero_()
        self.count[0] = 1
        for weights in versions:
            self.publish(weights)

    def get(self, version: int) -> list[float]:
        """The weights of ``version``, waiting in a worker until the main process publishes it.

        Args:
            version: the version number.

        Raises:
            RuntimeError: the version is missing in the main process, the main process is gone, or
                it did not publish the version within :attr:`wait_timeout` seconds.
        """
        k = len(self.names)
        if version < self.capacity and int(self.table[version, k]) == version + 1:
            return self.table[version, :k].tolist()
        if version >= self.capacity:
            raise RuntimeError(f"WeightVersions: version {version} is beyond the table's {self.capacity}; {self.what}.")
        if os.getpid() == self.owner:
            raise RuntimeError(
                f"The train stream needs the weights of mixture update {version}, which the main process has not "
                f"computed yet ({self.what}); the stream runs further ahead of training than the weights' delay allows. "
                "Raise mix_update_every or lower prefetch_factor.")
        start, sleep = time.monotonic(), _FIRST_SLEEP
        while int(self.table[version, k]) != version + 1:
            if not self._owner_alive():
                raise RuntimeError(f"A dataloader worker waited for the weights of mixture update {version}, but the "
                                   f"main process (pid {self.owner}) is gone; the worker stops.")
            if time.monotonic() - start > self.wait_timeout:
                raise RuntimeError(
                    f"A dataloader worker waited {self.wait_timeout:.0f} s for the weights of mixture update {version} "
                    f"({self.what}), and the main process did not publish them; it may be stuck or run further behind "
                    "than the weights' delay allows. Raise mix_update_every or lower prefetch_factor.")
            time.sleep(sleep)
            sleep = min(sleep * 2, _LONGEST_SLEEP)
        return self.table[version, :k].tolist()

    def _owner_alive(self) -> bool:
        """Whether the main process still runs: it is this worker's parent (fork, spawn), or it exists
        and has not exited (a worker started by a forkserver)."""
        if os.getppid() == self.owner:
            return True
        try:
            with open(f"/proc/{self.owner}/stat", encoding="ascii") as handle:
                state = handle.read().rpartition(")")[2].split()[0]
            return state not in ("Z", "X")  # an exited process not reaped yet is gone too
        except (OSError, IndexError):
            pass
        try:
            os.kill(self.owner, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
