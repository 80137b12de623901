"""The Python API prints no known third-party deprecation noise: a fit with checkpoints, through the
package's loaders, shows neither torchdata's ``set_vital`` warning nor Lightning's pytree one."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from conftest import make_texts, write_jsonl
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_tune_data import LocalDatasetManager, TextDataModule
from lightning_tune_data.loading.known_warnings import KNOWN_THIRD_PARTY_WARNINGS, ignore_known_third_party_warnings
from lightning_tune_data.models import TinyCausalLM


def _known(message: str) -> bool:
    return any(re.match(pattern, message) for pattern in KNOWN_THIRD_PARTY_WARNINGS)


def test_the_patterns_match_the_third_party_messages_and_nothing_of_ours():
    assert _known("'set_vital' is deprecated, please do not call")
    assert _known("`isinstance(treespec, LeafSpec)` is deprecated, use `isinstance(treespec, TreeSpec)` instead.")
    assert not _known("Train source 'prose': 135 of 1,317 documents (10.3%) are longer than max_seq_len=256")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ignore_known_third_party_warnings()
        warnings.warn("'set_vital' is deprecated, please do not call", UserWarning)
        warnings.warn("a warning of the user's own", UserWarning)
    assert [str(w.message) for w in caught] == ["a warning of the user's own"]


def test_a_python_api_fit_with_checkpoints_and_validation_shows_no_known_third_party_warning(tmp_path: Path):
    train = write_jsonl(tmp_path / "train.jsonl", make_texts(40, seed=1))
    val = write_jsonl(tmp_path / "val.jsonl", make_texts(8, seed=2))
    dm = TextDataModule(dataset_managers={"train": {"notes": LocalDatasetManager(data_files=str(train))},
                                          "val": {"lm": LocalDatasetManager(data_files=str(val))}},
                        max_seq_len=64, batch_size=4, packing="greedy", cache_dir=str(tmp_path / "cache"))
    model = TinyCausalLM(vocab_size=dm.vocab_size, max_seq_len=64, d_model=16, n_layers=1, n_heads=2)
    trainer = Trainer(max_steps=2, val_check_interval=2, check_val_every_n_epoch=None, limit_val_batches=1,
                      logger=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=str(tmp_path), callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt")])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model, datamodule=dm)
    assert trainer.global_step == 2
    assert [str(w.message) for w in caught if _known(str(w.message))] == []
