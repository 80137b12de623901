"""``ReaderPositions``: where every reader of a node's shard cache is in the pass order.

Each reading process (a rank or a dataloader worker) owns one small file in the store's cache
folder, ``.readers/<random>.pos``, and holds a lock on it while it lives (see
:mod:`lightning_tune_data.cache.owners`); it writes its position (pass and window) there
whenever it enters a new window. A process that makes room reads the positions of the live
readers, so a shard that another reader of the node needs soon is not evicted because this
reader has passed it. A file nobody holds a lock on belongs to a process that ended: the next
reader that looks removes it. A position not written for :data:`POSITION_TTL_S` is ignored (a
process that stopped reading this store, e.g. one that looked at a batch before training).
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from pathlib import Path

from lightning_tune_data.cache.owners import claim, claimed, release, remove_if_unclaimed

__all__ = ["POSITION_TTL_S", "READERS_FOLDER", "ReaderPositions"]

log = logging.getLogger("lightning_tune_data.cache.store")

#: Folder of a shard cache holding one position file per reading process.
READERS_FOLDER = ".readers"
#: A position older than this (seconds) is a reader that stopped reading the store.
POSITION_TTL_S = 600.0
_SUFFIX = ".pos"
_RECORD_BYTES = 64  # written in place, padded: a reader never sees a half-written record


class ReaderPositions:
    """The positions of the processes reading one shard cache.

    Args:
        folder: the shard cache's folder.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder) / READERS_FOLDER
        self._fd: int | None = None
        self._path: Path | None = None

    def forget_inherited(self) -> None:
        """In a forked child: the parent's position file is not this process's (its lock was
        closed at the fork)."""
        self._fd = self._path = None

    def register(self) -> None:
        """Own a position file (no position yet): this process reads the store from now on."""
        self._write(b"")

    def publish(self, epoch: int, window: int) -> None:
        """Record this process's position: window ``window`` of pass ``epoch`` (best effort: a
        full disk only makes eviction less informed, never stops the reader)."""
        self._write(json.dumps([int(epoch), int(window)]).encode())

    def _write(self, record: bytes) -> None:
        try:
            if self._fd is None:
                self.folder.mkdir(parents=True, exist_ok=True)
                self._path = self.folder / f"{uuid.uuid4().hex[:16]}{_SUFFIX}"
                self._fd = claim(self._path)
            os.pwrite(self._fd, record.ljust(_RECORD_BYTES), 0)
        except OSError as error:
            log.debug("could not record this reader's position in %s: %s", self.folder, error)

    def close(self) -> None:
        """Remove this process's position (it stops reading the store)."""
        if self._fd is not None and self._path is not None:
            self._path.unlink(missing_ok=True)
            release(self._fd)
        self._fd = self._path = None

    def _files(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        return [path for path in self.folder.iterdir() if path.name.endswith(_SUFFIX)]

    def others(self) -> list[tuple[int, int]]:
        """The positions of the other live readers that read lately (the files of ended processes are removed)."""
        found = []
        for path in self._files():
            if path == self._path:
                continue
            if not claimed(path):
                remove_if_unclaimed(path)
                continue
            try:
                if time.time() - path.stat().st_mtime > POSITION_TTL_S:
                    continue
                epoch, window = json.loads(path.read_bytes().decode().strip() or "null")
            except (OSError, ValueError, TypeError):
                continue
            found.append((int(epoch), int(window)))
        return found

    def any_live(self) -> bool:
        """Whether any live process reads this store (this one included)."""
        return any(claimed(path) for path in self._files())
