"""``ShuffleBuffer``: the documents a stream without random access holds back to shuffle them.

Once the buffer is full, each new document replaces a uniformly drawn one, which is handed out;
at the end of a pass the buffer is drained in random order. Draw ``n`` of a pass comes from a
counter-based generator seeded by ``(seed, source name, shard, epoch, n // 1024)``, so the
generator's state is one integer (the draw count) and the order differs between passes, shards
and seeds.

The buffered documents cannot be re-read by reference from a stream, so the saved state holds
their tokens (plain lists): at most ``size`` documents per shard.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lightning_tune_data.distributed import ShardInfo
from lightning_tune_data.settings import StreamSettings
from lightning_tune_data.sources.permutation import name_key

__all__ = ["ShuffleBuffer", "StreamDocument"]

#: A buffered document: token ids (int64) and an optional bool loss mask.
StreamDocument = tuple[np.ndarray, "np.ndarray | None"]

#: Uniform draws generated per counter-seeded block (the generator state is only the draw counter).
_DRAW_BLOCK = 1024

# State keys.
_DRAWS = "draws"
_SIZE = "shuffle_buffer_size"
_LENGTHS = "buffer_lengths"
_INPUT_IDS = "buffer_input_ids"
_HAS_MASK = "buffer_has_loss_mask"
_LOSS_MASK = "buffer_loss_mask"


class ShuffleBuffer:
    """Up to ``size`` held-back documents of one source shard, and the draws that pick among them.

    Args:
        source: the source's name (seeds the draws; named in errors).
        size: documents held (``0``: no shuffling, documents pass straight through).
        settings: the run's settings (``seed`` seeds the draws).
    """

    def __init__(self, source: str, size: int, settings: StreamSettings) -> None:
        self.source = source
        self.size = size
        self.settings = settings
        self.documents: list[StreamDocument] = []
        #: Draws made in the current pass (the generator's whole state).
        self.draws = 0
        self._block_key: tuple[int, int, int] | None = None
        self._block: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["documents"] = list(self.documents)
        state["_block_key"] = state["_block"] = None
        return state

    def draw_index(self, epoch: int, shard: ShardInfo) -> int:
        """The next uniform index into :attr:`documents` (at least one is held).

        Args:
            epoch: the pass being read.
            shard: this process's shard.
        """
        block, offset = divmod(self.draws, _DRAW_BLOCK)
        key = (epoch, block, shard.shard_id)
        if self._block_key != key:
            entropy = [self.settings.seed, name_key(self.source), shard.shard_id, shard.num_shards, epoch, block]
            self._block = np.random.default_rng(entropy).random(_DRAW_BLOCK)
            self._block_key = key
        self.draws += 1
        size = len(self.documents)
        return min(int(self._block[offset] * size), size - 1)

    def state_dict(self) -> dict[str, Any]:
        """The draw count, the size and the held documents' tokens, as plain lists (fresh)."""
        documents = self.documents
        lengths = np.array([len(ids) for ids, _ in documents], dtype=np.int64)
        has_mask = np.array([mask is not None for _, mask in documents], dtype=bool)
        ids = np.concatenate([ids for ids, _ in documents]) if documents else np.zeros(0, np.int64)
        masks = [mask for _, mask in documents if mask is not None]
        mask = np.concatenate(masks) if masks else np.zeros(0, bool)
        return {
            _DRAWS: self.draws,
            _SIZE: self.size,
            _LENGTHS: lengths.tolist(),
            _INPUT_IDS: ids.tolist(),
            _HAS_MASK: has_mask.tolist(),
            _LOSS_MASK: mask.tolist(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Hold again the documents of a :meth:`state_dict` result (or of a state that contains it).

        Args:
            state: a state with the keys :meth:`state_dict` writes.

        Raises:
            ValueError: the state was written with another buffer size, or is inconsistent.
        """
        if state[_SIZE] != self.size:
            raise ValueError(
                f"Source '{self.source}': the checkpoint was written with a shuffle buffer of "
                f"{state[_SIZE]} documents (0 = no shuffle) but this source has "
                f"{self.size}. Resume with the same shuffle and shuffle_buffer_size."
            )
        lengths = np.asarray(state[_LENGTHS], dtype=np.int64)
        has_mask = np.asarray(state[_HAS_MASK], dtype=bool)
        ids = np.asarray(state[_INPUT_IDS], dtype=np.int64)
        masks = np.asarray(state[_LOSS_MASK], dtype=bool)
        if int(lengths.sum()) != len(ids) or len(has_mask) != len(lengths):
            raise ValueError(f"Source '{self.source}': the saved shuffle buffer is inconsistent; the state is corrupt.")
        documents: list[StreamDocument] = []
        id_offset = mask_offset = 0
        for length, flagged in zip(lengths.tolist(), has_mask.tolist()):
            doc_ids = ids[id_offset : id_offset + length]
            id_offset += length
            doc_mask = None
            if flagged:
                doc_mask = masks[mask_offset : mask_offset + length]
                mask_offset += length
            documents.append((doc_ids, doc_mask))
        self.documents = documents
        self.draws = int(state[_DRAWS])
