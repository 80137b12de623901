"""``ReaderPositions``: where every reader of a node's shard cache is in the pass order.

Each reading process (a rank or a dataloader worker) writes its position (pass and window) to a
small file named after its process id in the cache folder whenever it enters a new window.
A process that makes room reads them all, so a shard that another reader of the node needs
soon is not evicted because this reader has passed it. Files of processes that ended are
removed by the next reader that looks.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from lightning_tune_data.cache.layout import process_alive

__all__ = ["READERS_FOLDER", "ReaderPositions"]

#: Folder of a shard cache holding one position file per reading process.
READERS_FOLDER = ".readers"


class ReaderPositions:
    """The positions of the processes reading one shard cache.

    Args:
        folder: the shard cache's folder.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder) / READERS_FOLDER

    def publish(self, epoch: int, window: int) -> None:
        """Record this process's position: window ``window`` of pass ``epoch``."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{os.getpid()}.json"
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps([int(epoch), int(window)]), encoding="utf-8")
        os.replace(temporary, path)

    def others(self) -> list[tuple[int, int]]:
        """The positions of the other live readers (the files of ended processes are removed)."""
        found = []
        if not self.folder.is_dir():
            return found
        for path in self.folder.glob("*.json"):
            pid = int(path.stem) if path.stem.isdigit() else -1
            if pid == os.getpid():
                continue
            if pid < 0 or not process_alive(pid):
                path.unlink(missing_ok=True)
                continue
            try:
                epoch, window = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            found.append((int(epoch), int(window)))
        return found
