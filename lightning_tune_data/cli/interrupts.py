"""Ctrl-C during a run: one clean "graceful shutdown", whenever the interrupt arrives.

``kill -INT`` to the process group (what Ctrl-C in a terminal does) reaches the main process *and*
every dataloader worker. Left alone, a worker interrupted while it hands over a batch dies with a
traceback, and the main process, which may get the interrupt inside code that swallows it (a fork
of the next workers, for instance), then fails with ``DataLoader worker ... exited unexpectedly``.
So the command line arranges that:

* processes forked from the main process (dataloader workers, preprocessing pools) ignore the
  interrupt: the main process shuts them down;
* the main process remembers an interrupt, and :class:`InterruptCallback` raises it again at the
  next batch if it was swallowed, so Lightning's graceful shutdown always runs.
"""

from __future__ import annotations

import os
import signal
from types import FrameType
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

__all__ = ["InterruptCallback", "install_interrupt_handling", "interrupt_pending"]

_state = {"installed": False, "pending": False}


def _on_interrupt(signum: int, frame: FrameType | None) -> None:
    _state["pending"] = True
    raise KeyboardInterrupt


def _ignore_in_child(signum: int, frame: FrameType | None) -> None:
    """A forked helper process leaves the interrupt to the main process (not inherited by ``exec``)."""


def _after_fork_in_child() -> None:
    _state["pending"] = False
    if signal.getsignal(signal.SIGINT) is _on_interrupt:
        signal.signal(signal.SIGINT, _ignore_in_child)


def install_interrupt_handling() -> None:
    """Handle SIGINT in the main process and leave it to the main process in forked helpers.

    Called once by the command line's entry point (it changes process-wide signal handling, so
    the library never calls it on its own). Safe to call again.
    """
    signal.signal(signal.SIGINT, _on_interrupt)
    if not _state["installed"]:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _state["installed"] = True


def interrupt_pending() -> bool:
    """Whether an interrupt arrived that has not been raised where Lightning could see it yet."""
    return _state["pending"]


def _raise_if_pending() -> None:
    if _state["pending"]:
        _state["pending"] = False
        raise KeyboardInterrupt


class InterruptCallback(Callback):
    """Raises an interrupt that was swallowed again at the next batch or evaluation start.

    Lightning turns a ``KeyboardInterrupt`` raised in a hook into its graceful shutdown. Without
    :func:`install_interrupt_handling` nothing is ever pending and this callback does nothing.
    """

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        """Raise a pending interrupt before the training step.

        Args:
            trainer: The running Trainer.
            pl_module: The model.
            batch: The batch about to be trained on.
            batch_idx: Its index.
        """
        _raise_if_pending()

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Raise a pending interrupt before validation reads its first batch.

        Args:
            trainer: The running Trainer.
            pl_module: The model.
        """
        _raise_if_pending()

    def on_validation_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int,
                                  dataloader_idx: int = 0) -> None:
        """Raise a pending interrupt before a validation step.

        Args:
            trainer: The running Trainer.
            pl_module: The model.
            batch: The batch about to be evaluated.
            batch_idx: Its index.
            dataloader_idx: Which validation dataloader it comes from.
        """
        _raise_if_pending()

    def on_test_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int,
                            dataloader_idx: int = 0) -> None:
        """Raise a pending interrupt before a test step.

        Args:
            trainer: The running Trainer.
            pl_module: The model.
            batch: The batch about to be evaluated.
            batch_idx: Its index.
            dataloader_idx: Which test dataloader it comes from.
        """
        _raise_if_pending()

    def on_predict_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int,
                               dataloader_idx: int = 0) -> None:
        """Raise a pending interrupt before a prediction step.

        Args:
            trainer: The running Trainer.
            pl_module: The model.
            batch: The batch about to be predicted.
            batch_idx: Its index.
            dataloader_idx: Which predict dataloader it comes from.
        """
        _raise_if_pending()
