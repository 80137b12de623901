"""``PredictionWriter``: writes what ``predict`` generates as decoded text, one JSON line per sample.

Each line is ``{"dataloader": <predict dataloader name>, "index": <sample position in that
dataloader on this rank>, "rank": <rank>, "text": <decoded text>, "token_ids": [...]}``. The
model's ``predict_step`` returns token ids per sample (a list of lists, or a ``[B, L]`` tensor),
as :class:`~lightning_tune_data.models.TinyCausalLM` does; they are decoded with the datamodule's
tokenizer.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter

__all__ = ["PredictionWriter", "sample_token_ids"]


class PredictionWriter(BasePredictionWriter):
    """Write decoded predictions to a JSON Lines file as each predict batch finishes.

    Args:
        output_path: The JSONL file to write (parent folders are created). Under DDP every rank
            writes its own file, ``<stem>.rank<N><suffix>``.
        include_token_ids: Also write the raw token ids of each sample.
    """

    def __init__(self, output_path: str = "predictions.jsonl", include_token_ids: bool = True) -> None:
        super().__init__(write_interval="batch")
        self.output_path = Path(output_path)
        self.include_token_ids = include_token_ids
        self._handle: TextIO | None = None
        self._counts: dict[int, int] = {}
        self.written_path: Path | None = None

    def _path_for(self, trainer: Trainer) -> Path:
        """The file this rank writes: ``output_path``, or ``<stem>.rank<N><suffix>`` under DDP."""
        if trainer.world_size <= 1:
            return self.output_path
        path = self.output_path
        return path.with_name(f"{path.stem}.rank{trainer.global_rank}{path.suffix}")

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Before a prediction restores a checkpoint: hide Lightning's note about the fit's callbacks.

        Lightning warns when a checkpoint holds the state of callbacks the run does not have (the
        fit's ``ModelCheckpoint``, ``DatasetMetricsCallback``); a prediction needs none of them.

        Args:
            trainer: The trainer.
            pl_module: The module.
            stage: The Lightning stage about to run; only ``predict`` hides the note.
        """
        if stage == "predict":
            warnings.filterwarnings("ignore", message=r"Be aware that when using `ckpt_path`, callbacks used to create")

    def on_predict_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Open (truncate) this rank's output file and restart the per-dataloader sample numbering.

        Args:
            trainer: The trainer.
            pl_module: The module.
        """
        # Lightning warns that it cannot record sample indices for iterable eval loaders; this writer
        # numbers the samples itself, so the warning says nothing to act on.
        warnings.filterwarnings("ignore", message=r"Couldn't infer the batch indices fetched from your dataloader")
        self.written_path = self._path_for(trainer)
        self.written_path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = self.written_path.open("w", encoding="utf-8")
        self._counts = {}

    def on_predict_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """Close the output file.

        Args:
            trainer: The trainer.
            pl_module: The module.
        """
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def write_on_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        prediction: Any,
        batch_indices: Sequence[int] | None,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        """Decode each sample of one predict batch and write it as a JSON line.

        Args:
            trainer: The trainer (its datamodule names the dataloader and decodes).
            pl_module: The module.
            prediction: What ``predict_step`` returned: token ids per sample.
            batch_indices: Ignored (samples are numbered per dataloader here).
            batch: The predict batch.
            batch_idx: Index of the batch in its dataloader.
            dataloader_idx: Index of the predict dataloader.

        Raises:
            RuntimeError: no file is open, or the datamodule has no tokenizer.
        """
        if self._handle is None:
            raise RuntimeError("PredictionWriter: no output file is open; it writes during Trainer.predict only.")
        datamodule = trainer.datamodule
        if datamodule is None or not hasattr(datamodule, "tokenizer"):
            raise RuntimeError(
                "PredictionWriter decodes with the datamodule's tokenizer; run predict with a TextDataModule."
            )
        name = datamodule.dataloader_name("predict", dataloader_idx)
        for ids in sample_token_ids(prediction, name):
            index = self._counts.get(dataloader_idx, 0)
            self._counts[dataloader_idx] = index + 1
            line: dict[str, Any] = {"dataloader": name, "index": index, "rank": trainer.global_rank,
                                    "text": datamodule.tokenizer.decode(ids)}
            if self.include_token_ids:
                line["token_ids"] = ids
            self._handle.write(json.dumps(line, ensure_ascii=False) + "\n")
        self._handle.flush()


def sample_token_ids(prediction: Any, name: str) -> list[list[int]]:
    """Token ids per sample from a ``predict_step`` output (list of id lists or a 2-D tensor).

    Args:
        prediction: What ``predict_step`` returned.
        name: The predict dataloader's name (named in errors).

    Raises:
        ValueError: ``prediction`` is not token ids per sample.
    """
    if isinstance(prediction, torch.Tensor):
        if prediction.dim() != 2:
            raise ValueError(
                f"PredictionWriter: predict_step for dataloader '{name}' returned a tensor of shape "
                f"{tuple(prediction.shape)}; return token ids per sample ([batch, tokens])."
            )
        return [[int(t) for t in row] for row in prediction.tolist()]
    if isinstance(prediction, (list, tuple)) and all(isinstance(row, (list, tuple, torch.Tensor)) for row in prediction):
        return [[int(t) for t in (row.tolist() if isinstance(row, torch.Tensor) else row)] for row in prediction]
    raise ValueError(
        f"PredictionWriter: predict_step for dataloader '{name}' returned {type(prediction).__name__}; return "
        "token ids per sample (a list of id lists or a [batch, tokens] tensor)."
    )
