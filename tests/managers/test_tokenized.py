"""TokenizedDatasetManager end to end: a real Trainer fit on a Megatron corpus mixed with a text
source, resumed from a checkpoint bitwise; configured from YAML; never built by prepare."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import BatchRecorder, make_texts, write_jsonl
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from tokenized_writers import EOS, documents, write_litdata, write_mds, write_megatron

from lightning_tune_data import LocalDatasetManager, TextDataModule, TokenizedDatasetManager
from lightning_tune_data.datamodule.store_tasks import stored_sources
from lightning_tune_data.formats import ranged
from lightning_tune_data.formats.ranged import RangedCorpus
from lightning_tune_data.keys import INPUT_IDS
from lightning_tune_data.managers import DataSourceError
from lightning_tune_data.managers.tokenized import AppendEos
from lightning_tune_data.models import TinyCausalLM
from lightning_tune_data.report.batches import datamodule_from_config

CHECKPOINT_STEP, FINAL_STEP = 4, 9


def corpus(root: Path) -> Path:
    write_megatron(root / "megatron" / "web_text_document", documents(120, seed=21, longest=50))
    write_jsonl(root / "text.jsonl", make_texts(60, seed=22))
    return root


def datamodule(root: Path, **options) -> TextDataModule:
    managers = {"web": TokenizedDatasetManager(str(root / "megatron"), weight=0.6),
                "text": LocalDatasetManager(data_files=str(root / "text.jsonl"), weight=0.4)}
    settings = dict(max_seq_len=48, batch_size=4, seed=3, cache_dir=str(root / "cache"), mix_by="tokens")
    return TextDataModule({"train": managers}, **{**settings, **options})


def recorded_fit(make_datamodule, run: Path, ckpt_path: str | None = None) -> tuple[BatchRecorder, TextDataModule]:
    """A fit to FINAL_STEP recording its batches, checkpointing every CHECKPOINT_STEP into ``run/ckpt``."""
    seed_everything(0)
    recorder = BatchRecorder()
    trainer = Trainer(accelerator="cpu", max_steps=FINAL_STEP, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=0, default_root_dir=run,
                      callbacks=[recorder, ModelCheckpoint(dirpath=run / "ckpt", every_n_train_steps=CHECKPOINT_STEP,
                                                           save_top_k=-1)])
    dm = make_datamodule()
    model = TinyCausalLM(vocab_size=1024, max_seq_len=48, d_model=16, n_layers=1, n_heads=2)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return recorder, dm


def fit(root: Path, run: Path, ckpt_path: str | None = None, **options) -> BatchRecorder:
    return recorded_fit(lambda: datamodule(root, **options), run, ckpt_path)[0]


@pytest.mark.parametrize(("packing", "num_workers"), [(None, 0), ("best_fit", 2)])
def test_a_fit_on_a_megatron_corpus_and_a_text_source_resumes_bitwise(tmp_path: Path, packing, num_workers) -> None:
    root = corpus(tmp_path)
    full = fit(root, tmp_path / "full", packing=packing, num_workers=num_workers)
    assert {name for provenance in full.provenance for name in provenance["source"]} == {"web", "text"}
    [checkpoint] = (tmp_path / "full" / "ckpt").glob(f"*step={CHECKPOINT_STEP}.ckpt")
    resumed = fit(root, tmp_path / "resumed", str(checkpoint), packing=packing, num_workers=num_workers)
    assert resumed.steps == list(range(CHECKPOINT_STEP, FINAL_STEP))
    for want, got in zip(full.batches[CHECKPOINT_STEP:], resumed.batches, strict=True):
        for key in want:
            if isinstance(want[key], torch.Tensor):
                assert torch.equal(want[key], got[key]), key
    web_ids = torch.cat([batch[INPUT_IDS].flatten() for batch in full.batches])
    assert int(web_ids.max()) > 258  # ids only the Megatron corpus holds reached the model


def test_a_yaml_config_builds_it_and_prepare_leaves_it_alone(tmp_path: Path) -> None:
    root = corpus(tmp_path)
    config = {"data": {"dataset_managers": {"train": {"web": {
        "class_path": "lightning_tune_data.TokenizedDatasetManager",
        "init_args": {"path": str(root / "megatron"), "format": "megatron", "weight": 2.0}}}},
        "cache_dir": str(root / "cache")}}
    built = datamodule_from_config(config)
    manager = built.dataset_managers["train"]["web"]
    assert isinstance(manager, TokenizedDatasetManager) and manager.format == "megatron" and manager.weight == 2.0
    assert list(stored_sources(built)) == []
    with pytest.raises(DataSourceError, match="format 'parquet' is not one of"):
        TokenizedDatasetManager(str(root), format="parquet")


def test_append_eos_ends_each_document_once() -> None:
    append = AppendEos(EOS)
    assert append({INPUT_IDS: np.array([1, 2], np.uint16)})[INPUT_IDS].tolist() == [1, 2, EOS]
    assert append({INPUT_IDS: np.array([1, EOS], np.uint16)})[INPUT_IDS].tolist() == [1, EOS]
    masked = append({INPUT_IDS: np.array([1]), "loss_mask": np.array([False])})
    assert masked["loss_mask"].tolist() == [False, True]
    manager = TokenizedDatasetManager("unused", append_eos=True)
    with pytest.raises(DataSourceError, match="append_eos needs eos_id"):
        manager.stream_transforms()
    assert isinstance(TokenizedDatasetManager("unused", append_eos=True, eos_id=7).stream_transforms()["output_transform"],
                      AppendEos)


def test_every_readme_example_config_builds_the_manager_it_shows(tmp_path: Path) -> None:
    import re

    import yaml

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Bring a tokenized corpus", 1)[1].split("\n## ", 1)[0]
    examples = [yaml.safe_load(block) for block in re.findall(r"```yaml\n(.*?)```", section, flags=re.S)]
    assert len(examples) == 8
    formats = []
    for example in examples:
        data = {key: value for key, value in example["data"].items() if key != "tokenizer"}
        built = datamodule_from_config({"data": {**data, "cache_dir": str(tmp_path)}})
        [manager] = built.dataset_managers["train"].values()
        assert isinstance(manager, TokenizedDatasetManager)
        formats.append(manager.format)
    assert sorted(formats) == sorted(["megatron", "datatrove", "dolma", "nanogpt", "llmc", "litdata", "mds", "auto"])


def ddp_fit_ranks(tmp_path: Path, steps: int, *remote: str) -> list[dict]:
    """Both ranks' records of ``tests/scripts/tokenized_ddp_fit.py`` (2 gloo ranks), checked to have
    run ``steps`` full batches each, of documents no other rank trained on."""
    import json
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "tokenized_ddp_fit.py"
    result = subprocess.run([sys.executable, str(script), str(tmp_path), str(tmp_path / "run"), str(steps), *remote],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((tmp_path / "run" / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [len(rank["batches"]) for rank in ranks] == [steps, steps]
    assert all(rank["global_step"] == steps for rank in ranks)
    assert all(len(batch) == 4 for rank in ranks for batch in rank["batches"])
    web = [{tuple(tokens) for batch in rank["batches"] for source, tokens in batch if source == "web"} for rank in ranks]
    assert web[0] and web[1] and not web[0] & web[1]
    assert ranks[0]["batches"] != ranks[1]["batches"]
    return ranks


@pytest.mark.slow
def test_under_ddp_every_rank_gets_equal_batches_of_disjoint_documents(tmp_path: Path) -> None:
    write_megatron(tmp_path / "megatron" / "web", documents(200, seed=23, longest=50))
    write_jsonl(tmp_path / "a.jsonl", make_texts(80, seed=24))
    assert not any(rank["ranged"] for rank in ddp_fit_ranks(tmp_path, 6))


@pytest.mark.slow
def test_under_ddp_a_corpus_read_by_ranges_gives_every_rank_equal_batches_of_disjoint_documents(
        tmp_path: Path, s3) -> None:
    remote_corpus(tmp_path, s3)  # 27 KB of ids on the stand-in; the script's budget share is 8 KB
    (tmp_path / "text.jsonl").rename(tmp_path / "a.jsonl")
    ranks = ddp_fit_ranks(tmp_path, 8, f"{s3.url}/corpus/", s3.endpoint)
    assert all(rank["ranged"] for rank in ranks)
    assert not list((tmp_path / "cache").rglob("*.bin"))  # nothing of the corpus was copied whole:
    assert list((tmp_path / "cache").rglob("*.ids"))  # its ranges went through the node's shard cache


def test_a_capped_tokenized_source_is_planned_to_stop_at_its_cap(tmp_path: Path) -> None:
    root = corpus(tmp_path)
    managers = {"web": TokenizedDatasetManager(str(root / "megatron"), weight=0.6, max_epochs=0.1),
                "text": LocalDatasetManager(data_files=str(root / "text.jsonl"), weight=0.4)}
    dm = TextDataModule({"train": managers}, max_seq_len=48, batch_size=4, seed=3, cache_dir=str(root / "cache"))
    trainer = Trainer(accelerator="cpu", max_steps=FINAL_STEP, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=0, default_root_dir=tmp_path / "run")
    trainer.fit(TinyCausalLM(vocab_size=1024, max_seq_len=48, d_model=16, n_layers=1, n_heads=2), datamodule=dm)
    web = next(row for row in dm.mixture.plan.sources if row.name == "web")
    assert web.cap_step is not None and 0 < web.cap_step < FINAL_STEP
    assert web.epochs == pytest.approx(0.1, abs=0.01)


def remote_corpus(root: Path, s3) -> None:
    """Three Megatron pairs on the S3 stand-in (27 KB of ids) and a local text source."""
    for number in range(3):
        write_megatron(root / "remote" / f"part-{number}", documents(150, seed=40 + number, longest=60))
    for path in sorted((root / "remote").iterdir()):
        s3.put(f"corpus/{path.name}", path.read_bytes())
    write_jsonl(root / "text.jsonl", make_texts(60, seed=22))


def ranged_fit(root: Path, s3, run: Path, packing: str, ckpt_path: str | None = None, **options) -> BatchRecorder:
    """A fit on the remote corpus read by 2 KB ranges under a 16 KB node budget (8 KB its share)."""
    managers = {"web": TokenizedDatasetManager(f"{s3.url}/corpus/", weight=0.6, storage_options=s3.storage_options),
                "text": LocalDatasetManager(data_files=str(root / "text.jsonl"), weight=0.4)}
    recorder, dm = recorded_fit(
        lambda: TextDataModule({"train": managers}, max_seq_len=48, batch_size=4, seed=3, cache_dir=str(root / "cache"),
                               mix_by="tokens", packing=packing, cache_budget=16384, **options), run, ckpt_path)
    assert isinstance(dm.dataset("train", "web"), RangedCorpus)
    return recorder


@pytest.mark.parametrize(("packing", "num_workers"), [("concat", 0), ("greedy", 0), ("best_fit", 2)])
def test_every_packing_strategy_trains_on_a_remote_corpus_read_by_ranges_and_resumes_bitwise(
        tmp_path: Path, s3, monkeypatch, packing, num_workers) -> None:
    monkeypatch.setattr(ranged, "RANGE_BYTES", 2048)
    remote_corpus(tmp_path, s3)
    full = ranged_fit(tmp_path, s3, tmp_path / "full", packing, num_workers=num_workers)
    assert {name for provenance in full.provenance for name in provenance["source"]} == {"web", "text"}
    [checkpoint] = (tmp_path / "full" / "ckpt").glob(f"*step={CHECKPOINT_STEP}.ckpt")
    shutil.rmtree(tmp_path / "cache" / "shard-cache")  # the resumed run starts on an empty node cache
    resumed = ranged_fit(tmp_path, s3, tmp_path / "resumed", packing, str(checkpoint), num_workers=num_workers)
    assert resumed.steps == list(range(CHECKPOINT_STEP, FINAL_STEP))
    for want, got in zip(full.batches[CHECKPOINT_STEP:], resumed.batches, strict=True):
        for key in want:
            assert torch.equal(want[key], got[key]), key
    if packing != "best_fit":
        return
    rewritten = (tmp_path / "remote" / "part-1.bin").read_bytes()[::-1]  # same size, other documents
    s3.put("corpus/part-1.bin", rewritten)
    with pytest.raises(ValueError, match=r"changed since the checkpoint was written: \['s3://.*/corpus/part-1\.bin'\]") as error:
        ranged_fit(tmp_path, s3, tmp_path / "changed", packing, str(checkpoint), num_workers=num_workers)
    assert "\n" not in str(error.value)


def test_a_litdata_corpus_read_in_place_between_item_sizes_resumes_bitwise(tmp_path: Path) -> None:
    write_litdata(tmp_path / "litdata", documents(120, seed=21, longest=50), tokens_loader=False)
    write_jsonl(tmp_path / "text.jsonl", make_texts(60, seed=22))

    def make() -> TextDataModule:
        managers = {"web": TokenizedDatasetManager(str(tmp_path / "litdata"), weight=0.6),
                    "text": LocalDatasetManager(data_files=str(tmp_path / "text.jsonl"), weight=0.4)}
        return TextDataModule({"train": managers}, max_seq_len=48, batch_size=4, seed=3, mix_by="tokens",
                              cache_dir=str(tmp_path / "cache"), packing="best_fit")

    full, dm = recorded_fit(make, tmp_path / "full")
    assert all(entry.starts is not None for entry in dm.dataset("train", "web").files)  # list views, no copy
    [checkpoint] = (tmp_path / "full" / "ckpt").glob(f"*step={CHECKPOINT_STEP}.ckpt")
    resumed, _ = recorded_fit(make, tmp_path / "resumed", str(checkpoint))
    assert resumed.steps == list(range(CHECKPOINT_STEP, FINAL_STEP))
    for want, got in zip(full.batches[CHECKPOINT_STEP:], resumed.batches, strict=True):
        for key in want:
            if isinstance(want[key], torch.Tensor):
                assert torch.equal(want[key], got[key]), key
    assert int(torch.cat([batch[INPUT_IDS].flatten() for batch in full.batches]).max()) > 258  # LitData ids read


def test_a_remote_mds_corpus_decoded_into_the_node_cache_resumes_bitwise(tmp_path: Path, s3) -> None:
    write_mds(tmp_path / "remote", documents(150, seed=41, longest=60), "zstd")  # 32 shards, 18 KB of ids
    for path in sorted((tmp_path / "remote").iterdir()):
        s3.put(f"corpus/{path.name}", path.read_bytes())
    write_jsonl(tmp_path / "text.jsonl", make_texts(60, seed=22))
    full = ranged_fit(tmp_path, s3, tmp_path / "full", "best_fit")
    [checkpoint] = (tmp_path / "full" / "ckpt").glob(f"*step={CHECKPOINT_STEP}.ckpt")
    shutil.rmtree(tmp_path / "cache" / "shard-cache")  # the resumed run decodes its shards again
    resumed = ranged_fit(tmp_path, s3, tmp_path / "resumed", "best_fit", str(checkpoint))
    assert resumed.steps == list(range(CHECKPOINT_STEP, FINAL_STEP))
    for want, got in zip(full.batches[CHECKPOINT_STEP:], resumed.batches, strict=True):
        for key in want:
            assert torch.equal(want[key], got[key]), key
    assert int(torch.cat([batch[INPUT_IDS].flatten() for batch in full.batches]).max()) > 258  # MDS ids were read


def test_the_report_draws_batches_of_a_foreign_source(tmp_path: Path) -> None:
    from lightning_tune_data.report.batches import collect

    root = corpus(tmp_path)
    report = collect(datamodule(root, packing="greedy"), batches=3, preview_rows=2)
    assert report.sources == ["web", "text"] and report.packing == "greedy"
    web = TokenizedDatasetManager(str(root / "megatron")).setup(None, tmp_path / "node")
    assert sorted(report.lengths["web"].tolist()) == sorted(np.diff(web.files[0].offsets).tolist())
    assert len(report.doc_shares["web"]) == 3 and report.doc_shares["web"][-1] > 0
