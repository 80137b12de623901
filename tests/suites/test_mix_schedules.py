"""Mixture schedules through a real Trainer: exact and elastic resume mid-schedule, caps, the plan
against a counted run, and the realised share per 5% window of the run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import BatchRecorder, make_texts, write_jsonl
from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_tune_data import LocalDatasetManager, TextDataModule

LINEAR = {"unit": "steps", "interpolation": "linear", "points": [
    {"at": 0.0, "weights": {"a": 0.9, "b": 0.1}}, {"at": 1.0, "weights": {"a": 0.1, "b": 0.9}}]}
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "schedule_ddp_fit.py"


def switch_at(step: int) -> dict:
    """All ``a`` until ``step``, all ``b`` from it."""
    return {"unit": "steps", "interpolation": "step", "points": [
        {"at": 0, "weights": {"a": 1.0, "b": 0.0}}, {"at": step, "weights": {"a": 0.0, "b": 1.0}}]}


class Still(LightningModule):
    """A model that trains on nothing (the data is what these tests look at): one parameter, lr 0."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
        return (self.w * batch["input_ids"].float().mean()) ** 2

    def configure_optimizers(self):  # noqa: ANN201
        return torch.optim.SGD(self.parameters(), lr=0.0)


def datamodule(corpus: Path, caps: dict | None = None, **options) -> TextDataModule:
    caps = caps or {}
    settings = dict(max_seq_len=64, batch_size=4, num_workers=2, seed=7, mix_schedule=LINEAR)
    settings.update(options)
    return TextDataModule(
        dataset_managers={"train": {
            name: LocalDatasetManager(data_files=str(corpus / f"{name}.jsonl"), **caps.get(name, {})) for name in "ab"}},
        cache_dir=str(corpus / "cache"), **settings)


def fit(corpus: Path, run_dir: Path, max_steps: int, ckpt_path: str | None = None, every: int | None = None,
        **options) -> tuple[BatchRecorder, TextDataModule]:
    seed_everything(0)
    recorder = BatchRecorder()
    callbacks = [recorder]
    if every:
        callbacks.append(ModelCheckpoint(dirpath=run_dir / "ckpt", every_n_train_steps=every, save_top_k=-1))
    trainer = Trainer(accelerator="cpu", max_steps=max_steps, callbacks=callbacks, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                      enable_checkpointing=bool(every), default_root_dir=run_dir)
    dm = datamodule(corpus, **options)
    trainer.fit(Still(), datamodule=dm, ckpt_path=ckpt_path)
    return recorder, dm


def checkpoint(run_dir: Path, step: int) -> str:
    return str(next((run_dir / "ckpt").glob(f"*step={step}.ckpt")))


def documents(recorder: BatchRecorder, source: str) -> list[tuple]:
    """(epoch, tokens) of every ``source`` document of an unpacked run (one document per row)."""
    out = []
    for batch, provenance in zip(recorder.batches, recorder.provenance):
        for row, (s, epoch) in enumerate(zip(provenance["source"], provenance["epoch"])):
            if s == source:
                ids = batch["input_ids"][row][batch["attention_mask"][row].bool()]
                out.append((epoch, tuple(ids.tolist())))
    return out


def share_of_a(provenances: list[dict], by: str) -> float:
    if by == "documents":
        starts = [s for p in provenances for s, new in zip(p["source"], p["new_document"]) if new]
        return starts.count("a") / len(starts)
    tokens = Counter()
    for p in provenances:
        for s, n in zip(p["source"], p["tokens"]):
            tokens[s] += n
    return tokens["a"] / sum(tokens.values())


@pytest.mark.parametrize("packing", [None, "best_fit", "greedy", "concat"])
def test_resume_mid_interpolation_with_workers_matches_the_uninterrupted_run(corpus_dir, tmp_path, packing):
    full, dm = fit(corpus_dir, tmp_path / "full", 16, every=7, packing=packing, batch_size=8)
    assert share_of_a(full.provenance[:5], "documents") > share_of_a(full.provenance[-5:], "documents") + 0.3
    assert dm.mixture.targets_at(7)["a"] == pytest.approx(0.9 - 0.8 * 7.5 / 16, abs=0.02)
    passes = {s: max(e for p in full.provenance[7:] for src, e in zip(p["source"], p["epoch"]) if src == s) for s in "ab"}
    if packing != "concat":  # concat's packs of long pieces hold fewer documents than these 16 steps need
        assert passes == {"a": 1, "b": 1}, "both sources must cross a pass boundary after the checkpoint"
    resumed, _ = fit(corpus_dir, tmp_path / "resumed", 16, ckpt_path=checkpoint(tmp_path / "full", 7), packing=packing,
                     batch_size=8)
    assert len(resumed.batches) == 9
    for want, got in zip(full.batches[7:], resumed.batches):
        assert want.keys() == got.keys()
        assert all(torch.equal(want[k], got[k]) for k in want)


def test_same_config_and_seed_give_the_same_batches(corpus_dir, tmp_path):
    first, _ = fit(corpus_dir, tmp_path / "one", 8)
    second, _ = fit(corpus_dir, tmp_path / "two", 8)
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(first.batches, second.batches))


def test_a_step_boundary_leaves_at_most_one_batch_of_the_old_mix(corpus_dir, tmp_path):
    run, _ = fit(corpus_dir, tmp_path / "run", 14, mix_schedule=switch_at(6))
    sources = [set(p["source"]) for p in run.provenance]
    assert all(s == {"a"} for s in sources[:6])
    old_after = [step for step, s in enumerate(sources) if step >= 6 and "a" in s]
    assert len(old_after) <= 1, f"batches {old_after} after the boundary still carry the old mix"
    assert all(s == {"b"} for s in sources[8:])


@pytest.mark.parametrize("change", [{"num_workers": 1}, {"num_workers": 1, "batch_size": 8}])
def test_elastic_resume_continues_the_schedule_where_it_was(corpus_dir, tmp_path, change):
    full, _ = fit(corpus_dir, tmp_path / "full", 6, every=6, mix_schedule=switch_at(10))
    with pytest.warns(UserWarning, match="new layout"):
        resumed, _ = fit(corpus_dir, tmp_path / "resumed", 16, ckpt_path=checkpoint(tmp_path / "full", 6),
                         mix_schedule=switch_at(10), **change)
    sources = [set(p["source"]) for p in resumed.provenance]  # steps 6..15
    assert all(s == {"a"} for s in sources[:3])  # steps 6-8: before the boundary, not a restarted schedule
    assert all(s == {"b"} for s in sources[5:])  # steps 11-15
    used = documents(full, "a") + documents(resumed, "a")
    assert len(used) == len(set(used)), "a document of the pass in progress was used twice"


def test_a_changed_schedule_on_resume_warns_and_applies_from_the_resume_step(corpus_dir, tmp_path):
    fit(corpus_dir, tmp_path / "full", 6, every=6, mix_schedule=switch_at(100))
    with pytest.warns(UserWarning, match="weights changed"):
        resumed, _ = fit(corpus_dir, tmp_path / "resumed", 12, ckpt_path=checkpoint(tmp_path / "full", 6),
                         mix_schedule=switch_at(8))
    sources = [set(p["source"]) for p in resumed.provenance]  # steps 6..11
    assert sources[0] == {"a"} and all(s == {"b"} for s in sources[3:])


def test_a_capped_source_stops_at_the_planned_step_and_is_read_about_once(corpus_dir, tmp_path):
    mix = {"points": [{"at": 0, "weights": {"a": 0.5, "b": 0.5}}]}
    run, dm = fit(corpus_dir, tmp_path / "run", 36, mix_schedule=mix, caps={"b": {"max_epochs": 1}})
    plan = {row.name: row for row in dm.mixture.plan.sources}
    assert plan["b"].cap_step == pytest.approx(47 / 2, abs=0.01)  # 47 documents at 2 per step
    b_steps = [step for step, p in enumerate(run.provenance) if "b" in p["source"]]
    assert abs(max(b_steps) - plan["b"].cap_step) <= 2
    used = documents(run, "b")
    assert abs(len(used) - 47) <= 3
    assert all(s == {"a"} for s in (set(p["source"]) for p in run.provenance[27:]))


def test_every_source_capped_before_max_steps_fails_in_setup_naming_the_step(corpus_dir, tmp_path):
    with pytest.raises(ValueError, match=r"every train source reaches its cap .* by step 27"):
        fit(corpus_dir, tmp_path / "run", 100, caps={"a": {"max_epochs": 1}, "b": {"max_epochs": 1}},
            mix_schedule={"points": [{"at": 0, "weights": {"a": 0.5, "b": 0.5}}]})


def test_the_plan_matches_a_counted_run(corpus_dir, tmp_path, capsys):
    run, dm = fit(corpus_dir, tmp_path / "run", 40)
    assert "Mixture plan (over 40 steps)" in capsys.readouterr().out
    counted = Counter(s for p in run.provenance for s, new in zip(p["source"], p["new_document"]) if new)
    tokens = Counter()
    for p in run.provenance:
        for s, n in zip(p["source"], p["tokens"]):
            tokens[s] += n
    for row in dm.mixture.plan.sources:
        assert row.documents == pytest.approx(counted[row.name], rel=0.05)
        assert row.tokens == pytest.approx(tokens[row.name], rel=0.1)
        assert row.epochs == pytest.approx(counted[row.name] / {"a": 61, "b": 47}[row.name], rel=0.05)


@pytest.fixture(scope="module")
def long_corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("long")
    write_jsonl(root / "a.jsonl", make_texts(3000, seed=1, prefix="A", max_words=30))
    write_jsonl(root / "b.jsonl", make_texts(3000, seed=2, prefix="B", min_words=10, max_words=80))
    return root


@pytest.mark.parametrize(("mix_by", "packing", "steps", "batch"), [
    ("documents", None, 400, 32), ("tokens", None, 400, 32), ("documents", "best_fit", 800, 16),
    ("tokens", "best_fit", 800, 16)])
def test_the_realised_share_follows_the_schedule_in_every_5_percent_window(long_corpus, tmp_path, mix_by, packing,
                                                                           steps, batch):
    run, dm = fit(long_corpus, tmp_path / "run", steps, mix_by=mix_by, packing=packing, batch_size=batch,
                  max_seq_len=512)
    window = steps // 20
    for w in range(20):
        realised = share_of_a(run.provenance[w * window:(w + 1) * window], mix_by)
        target = sum(dm.mixture.targets_at(s)["a"] for s in range(w * window, (w + 1) * window)) / window
        assert realised == pytest.approx(target, abs=0.02), f"window {w}: realised {realised:.3f}, target {target:.3f}"


def run_ddp(corpus: Path, run_dir: Path, steps: int, packing: str, mix_by: str, ckpt: str | None = None,
            switch_at: int | None = None) -> list[dict]:
    args = [sys.executable, str(SCRIPT), str(corpus), str(run_dir), str(steps), packing, mix_by] + ([ckpt] if ckpt else [])
    env = {**os.environ, **({"SCHEDULE_SWITCH_AT": str(switch_at)} if switch_at is not None else {})}
    result = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads((run_dir / f"rank{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.slow
def test_ddp_resume_mid_interpolation_is_exact_on_every_rank(corpus_dir, tmp_path):
    full = run_ddp(corpus_dir, tmp_path / "full", 12, "best_fit", "tokens")
    ckpt = str(next((tmp_path / "full" / "ckpt").glob("*step=5.ckpt")))
    resumed = run_ddp(corpus_dir, tmp_path / "resumed", 12, "best_fit", "tokens", ckpt)
    for rank, (want, got) in enumerate(zip(full, resumed)):
        assert got["batches"] == want["batches"][5:], f"rank {rank} resumed on different data"


@pytest.mark.slow
def test_two_ddp_ranks_then_one_continue_the_schedule_where_it_was(corpus_dir, tmp_path):
    run_ddp(corpus_dir, tmp_path / "ddp", 5, "none", "documents", switch_at=10)
    with pytest.warns(UserWarning, match="new layout"):
        resumed, _ = fit(corpus_dir, tmp_path / "one", 16, ckpt_path=checkpoint(tmp_path / "ddp", 5),
                         mix_schedule=switch_at(10))
    sources = [set(p["source"]) for p in resumed.provenance]  # steps 5..15 on one rank
    assert all(s == {"a"} for s in sources[:3]) and all(s == {"b"} for s in sources[6:])


@pytest.mark.slow
@pytest.mark.parametrize(("mix_by", "packing"), [("documents", "none"), ("tokens", "best_fit")])
def test_ddp_realised_share_follows_the_schedule_in_every_5_percent_window(long_corpus, tmp_path, mix_by, packing):
    steps = 400
    ranks = run_ddp(long_corpus, tmp_path / "run", steps, packing, mix_by)
    window = steps // 20
    for w in range(20):
        provenances = [p for r in ranks for p in r["provenance"][w * window:(w + 1) * window]]
        target = sum(ranks[0]["targets"][w * window:(w + 1) * window]) / window
        assert share_of_a(provenances, mix_by) == pytest.approx(target, abs=0.02), f"window {w}"


def test_the_target_is_logged_next_to_the_realised_share_and_the_report_plots_it(corpus_dir, tmp_path, capsys):
    from lightning.pytorch.loggers import CSVLogger

    from lightning_tune_data import DatasetMetricsCallback
    from lightning_tune_data.report.write import read_metrics_csv, write_metrics_report

    seed_everything(0)
    logger = CSVLogger(tmp_path / "logs", name="run")
    trainer = Trainer(accelerator="cpu", max_steps=20, logger=logger, log_every_n_steps=5, enable_progress_bar=False,
                      enable_model_summary=False, limit_val_batches=0, enable_checkpointing=False,
                      callbacks=[DatasetMetricsCallback(log_every_n_steps=5, window=5)])
    dm = datamodule(corpus_dir)
    trainer.fit(Still(), datamodule=dm)
    csv_path = Path(logger.log_dir) / "metrics.csv"
    rows = read_metrics_csv(csv_path)
    targets = [(row["step"], row["mix/a/target"]) for row in rows if "mix/a/target" in row]
    assert len(targets) >= 3 and all("dataset/a/window_share" in r for r in rows if "mix/a/target" in r)
    for step, target in targets:
        assert target == pytest.approx(dm.mixture.targets_at(step)["a"])
    assert targets[0][1] > targets[-1][1] + 0.4  # the target moves from 0.9 towards 0.1
    assert any("plan/b/epochs" in row for row in rows)
    table = capsys.readouterr().out
    assert "Data mix" in table and f"{100 * dm.mixture.targets_at(19)['b']:.1f}%" in table  # the last targets
    report = write_metrics_report(csv_path, tmp_path / "report").read_text()
    assert "## Mixture plan" in report and "## Mixture schedule: target vs realised" in report
    assert (tmp_path / "report" / "schedule.png").stat().st_size > 1000


ANNEAL_YAML = """
seed_everything: 0
trainer:
  accelerator: cpu
  max_steps: 10
  default_root_dir: RUNDIR
  logger: false
  enable_checkpointing: false
  enable_progress_bar: false
  enable_model_summary: false
model:
  class_path: lightning_tune_data.models.TinyCausalLM
  init_args: {d_model: 16, n_layers: 1, n_heads: 2}
data:
  max_seq_len: 64
  batch_size: 4
  cache_dir: CACHE
  mix_by: tokens
  packing: best_fit
  dataset_managers:
    train:
      a:
        class_path: lightning_tune_data.LocalDatasetManager
        init_args: {data_files: CORPUS/a.jsonl}
      b:
        class_path: lightning_tune_data.LocalDatasetManager
        init_args: {data_files: CORPUS/b.jsonl, max_epochs: 3, max_tokens: 20k}
  mix_schedule:
    unit: steps
    interpolation: cosine
    points:
      - {at: 0, weights: {a: 0.8, b: 0.2}}
      - {at: 0.8, weights: {a: 0.8, b: 0.2}}
      - {at: 1.0, weights: {a: 0.3, b: 0.7}}
"""


@pytest.mark.filterwarnings("ignore:LightningCLI's args parameter is intended")
def test_a_yaml_mix_schedule_and_caps_run_through_the_cli(corpus_dir, tmp_path, capsys):
    from lightning_tune_data.cli import run_cli

    config = tmp_path / "anneal.yaml"
    config.write_text(ANNEAL_YAML.replace("CACHE", str(tmp_path / "cache")).replace("CORPUS", str(corpus_dir))
                      .replace("RUNDIR", str(tmp_path / "run")))
    run_cli(["fit", "--config", str(config)])
    out = capsys.readouterr().out
    assert "Mixture plan (over 10 steps)" in out and "3 epochs / 20k tokens" in out
    assert (tmp_path / "run" / "config.yaml").is_file()  # the CLI's config copy lands in the run, not the checkout
