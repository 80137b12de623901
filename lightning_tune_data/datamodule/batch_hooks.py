"""The datamodule's batch-transfer hooks: count the train batches the model consumes, and expand
compact train batches into full ones on their device.

Lightning runs ``on_before_batch_transfer`` on every batch before it moves it to the model's device
and ``on_after_batch_transfer`` after. Its fit loop fetches one batch ahead of the one the model
trains on, so counting in the loader would be one batch early; counting here is exact. Compact
batches (``TextDataModule(compact_batches=True)``, the default) cross the worker boundary and the
host-to-device copy small and are expanded after the copy, where the device does the work.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities.model_helpers import is_overridden

from lightning_tune_data.collate import PackedCollator, PaddedCollator
from lightning_tune_data.collate.expand import expand_batch

__all__ = ["TrainBatchHooks", "compact_pays"]


def compact_pays(trainer: Any, num_workers: int) -> bool:
    """Whether compact train batches pay: a Trainer expands them (``on_after_batch_transfer``), and
    they either cross from dataloader workers (a fraction of the bytes to receive) or go to an
    accelerator (a fraction of the bytes to copy; the expansion runs there). In a CPU run without
    workers the full batch costs less to write than a compact one plus its expansion.

    Args:
        trainer: the Trainer attached to the datamodule, or ``None``.
        num_workers: the train loader's worker processes.
    """
    if trainer is None:
        return False
    device = getattr(getattr(trainer, "strategy", None), "root_device", None)
    return num_workers > 0 or getattr(device, "type", "cpu") != "cpu"


class TrainBatchHooks:
    """The two batch-transfer hooks of ``TextDataModule`` (a base class of it), and its train collator."""

    _batches_consumed: int
    mix_control: Any

    def train_collator(self) -> PaddedCollator | PackedCollator:
        """The train batches' collator: packs stacked when packing, else one padded document per row;
        compact batches where they pay (:func:`compact_pays`)."""
        cls = PackedCollator if self.packing is not None else PaddedCollator
        return cls(pad_id=self.tokenizer.pad_id, max_seq_len=self.max_seq_len, pad_to_multiple_of=self.pad_to_multiple_of,
                   compact=self.compact_batches and compact_pays(getattr(self, "trainer", None), self.num_workers))

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Count the train batches the model actually consumes (the fit loop prefetches one), and run an
        online mixing update that is due (the first batch after its step, on every rank); ``batch`` is
        returned as is.

        Args:
            batch: the batch the loader handed out.
            dataloader_idx: which loader it came from.
        """
        trainer = getattr(self, "trainer", None)
        if trainer is not None and trainer.training:
            self._batches_consumed += 1
            if self.mix_control is not None:
                self.mix_control.maybe_update(trainer)
        return batch

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Expand a compact train batch into the full batch on its device, then run the model's own
        ``on_after_batch_transfer`` if it has one (Lightning calls the datamodule's hook instead of
        the model's when both exist, so the model's runs here).

        Args:
            batch: the batch, on the model's device.
            dataloader_idx: which loader it came from.
        """
        batch = expand_batch(batch)
        model = getattr(getattr(self, "trainer", None), "lightning_module", None)
        if model is not None and is_overridden("on_after_batch_transfer", model):
            batch = model.on_after_batch_transfer(batch, dataloader_idx)
        return batch
