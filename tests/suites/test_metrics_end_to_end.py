"""Per-source dataset metrics end to end: real ``TextDataModule`` -> real Trainer -> logged metrics.

Issue 5's "done when", checked through the real data path (LocalDatasetManager on generated JSONL,
interleaving, packing, ``StatefulDataLoader`` workers, Lightning checkpoints, gloo DDP), never a
synthetic loader: the ``dataset/<name>/<metric>`` values logged by ``DatasetMetricsCallback`` must
equal what is counted directly from the batches the model trained on.

The reference counts come from each trained batch's provenance, which is first checked against
the batch's own tensors (token counts from ``attention_mask``/``seq_lens``, document starts from
the BOS token, the source from the decoded text prefix), so the test does not trust the side
channel blindly.
"""

from __future__ import annotations

import contextlib
import csv
import json
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import make_texts, write_jsonl
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from lightning_tune_data import ByteTokenizer, DatasetMetricsCallback, LocalDatasetManager, TextDataModule
from lightning_tune_data.cli import run_cli
from lightning_tune_data.models import TinyCausalLM

DDP_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "metrics_ddp_datamodule.py"
WEIGHTS = {"a": 0.7, "b": 0.3}
PREFIX = {"A": "a", "B": "b"}  # text prefix written by make_texts -> source name
STREAM = "all"
COUNTERS = ("samples_seen", "tokens_seen", "epochs_completed", "seq_len_window_size", "target_tokens", "no_target_docs")
WINDOW = 16  # small, so the sliding window (and its union across ranks) is really exercised

Record = tuple[str, int, int, bool, int]  # (source, tokens, epoch, new_document, target labels) of one document piece


# --------------------------------------------------------------------------- data and runs
@pytest.fixture
def small_corpus(tmp_path: Path) -> Path:
    """Two sources small enough that each wraps around (new passes) within a few steps."""
    write_jsonl(tmp_path / "a.jsonl", make_texts(9, seed=11, prefix="A", max_words=10))
    write_jsonl(tmp_path / "b.jsonl", make_texts(7, seed=12, prefix="B", max_words=10))
    return tmp_path


@pytest.fixture
def ddp_corpus(tmp_path: Path) -> Path:
    """Two sources of varied lengths (mostly under max_seq_len), enough for 2 ranks x 2 workers."""
    write_jsonl(tmp_path / "corpus" / "a.jsonl", make_texts(41, seed=13, prefix="A", max_words=10))
    write_jsonl(tmp_path / "corpus" / "b.jsonl", make_texts(29, seed=14, prefix="B", max_words=10))
    return tmp_path / "corpus"


def make_datamodule(corpus: Path, packing: str | None, num_workers: int = 2, weights=WEIGHTS) -> TextDataModule:
    return TextDataModule(
        dataset_managers={
            "train": {
                name: LocalDatasetManager(data_files=str(corpus / f"{name}.jsonl"), weight=weight)
                for name, weight in weights.items()
            }
        },
        max_seq_len=64,
        batch_size=4,
        num_workers=num_workers,
        seed=3,
        packing=packing,
        cache_dir=str(corpus / "cache"),
    )


def records_of(batch: dict[str, Any], tokenizer: ByteTokenizer) -> list[Record]:
    """The document pieces of one batch, from its provenance, after checking it against the tensors.

    Args:
        batch: A train batch as the model received it.
        tokenizer: Decodes document starts to read the source's text prefix.
    """
    prov = batch["provenance"]
    records = list(zip(prov["source"], prov["tokens"], prov["epoch"], prov["new_document"], prov["target_tokens"]))
    ids = batch["input_ids"]
    if "seq_lens" in batch:  # packed: one provenance entry per nonzero seq_len, row by row
        pieces = []
        for row in range(ids.shape[0]):
            offset = 0
            for length in (int(x) for x in batch["seq_lens"][row] if x > 0):
                pieces.append((row, offset, length))
                offset += length
    else:  # padded: one document per row
        lengths = batch["attention_mask"].sum(dim=1).tolist()
        pieces = [(row, 0, int(length)) for row, length in enumerate(lengths)]
    assert len(pieces) == len(records), "provenance must have one entry per document piece in the batch"
    for (row, offset, length), (source, tokens, _, new_document, targets) in zip(pieces, records):
        assert tokens == length, "provenance tokens must equal the piece's real tokens in the batch"
        assert targets == int((batch["labels"][row, offset : offset + length] != -100).sum()), \
            "provenance target_tokens must equal the piece's target labels in the batch"
        piece = ids[row, offset : offset + length].tolist()
        assert (piece[0] == tokenizer.bos_id) == new_document, "a new document starts with BOS, a continuation not"
        if new_document and length > 1:  # (a concat block may end right after a document's BOS)
            assert PREFIX[tokenizer.decode(piece[1:2])] == source, "provenance source must match the text"
    return [(str(s), int(t), int(e), bool(n), int(g)) for s, t, e, n, g in records]


class ProvenanceRecorder(Callback):
    """Records the document pieces of every batch the model trains on, in order."""

    def __init__(self) -> None:
        self.batches: list[list[Record]] = []
        self.steps: list[int] = []
        self.tokenizer = ByteTokenizer()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        self.steps.append(trainer.global_step)
        self.batches.append(records_of(batch, self.tokenizer))


def fit(corpus: Path, run_dir: Path, max_steps: int, packing: str | None, log_every: int = 3,
        ckpt_every: int | None = None, ckpt_path: str | None = None, num_workers: int = 2):
    """A real single-process fit; returns (metrics callback, recorder, CSV rows by step)."""
    seed_everything(0)
    metrics = DatasetMetricsCallback(log_every_n_steps=log_every, seq_len_stat_window_size=WINDOW)
    recorder = ProvenanceRecorder()
    callbacks: list[Callback] = [recorder, metrics]
    if ckpt_every:
        callbacks.append(ModelCheckpoint(dirpath=run_dir / "ckpt", every_n_train_steps=ckpt_every, save_top_k=-1))
    logger = CSVLogger(save_dir=run_dir, name="csv", version=0)
    trainer = Trainer(accelerator="cpu", max_steps=max_steps, callbacks=callbacks, logger=logger,
                      enable_checkpointing=bool(ckpt_every), enable_progress_bar=False, enable_model_summary=False,
                      limit_val_batches=0, log_every_n_steps=1000, default_root_dir=run_dir)
    datamodule = make_datamodule(corpus, packing, num_workers)
    model = TinyCausalLM(vocab_size=datamodule.vocab_size, max_seq_len=64, d_model=16, n_layers=1, n_heads=2)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    assert trainer.global_step == max_steps
    assert recorder.steps == list(range(max_steps - len(recorder.steps), max_steps)), "one batch per step"
    return metrics, recorder, read_logged(Path(logger.log_dir) / "metrics.csv")


def read_logged(path: Path) -> dict[int, dict[str, float]]:
    """``dataset/...`` values of a CSVLogger ``metrics.csv``, by optimizer step (empty cells dropped).

    Lightning logs the train loss of the batch that makes ``global_step`` reach ``n`` at CSV step
    ``n - 1``; the dataset metrics computed after that batch share its row.
    """
    rows: dict[int, dict[str, float]] = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            values = {k: float(v) for k, v in row.items() if k.startswith("dataset/") and v not in ("", None)}
            if values:
                rows.setdefault(int(row["step"]) + 1, {}).update(values)
    return rows


# --------------------------------------------------------------------------- reference metrics
def expected_metrics(ranks: Sequence[Sequence[Sequence[Record]]], weights: dict[str, float]) -> dict[str, dict]:
    """What the logged metrics must be, computed directly from each rank's trained batches.

    Counters are summed over ranks, ``epochs_completed`` is the highest epoch seen, and the
    sequence-length statistics are taken over the union of each rank's last ``WINDOW`` lengths.

    Args:
        ranks: Per rank, the records of every batch trained on so far.
        weights: Normalised target weights of the sources.
    """
    out: dict[str, dict] = {}
    for name in [STREAM, *weights]:
        samples = tokens = epochs = 0
        window: list[int] = []
        for batches in ranks:
            mine = [r for batch in batches for r in batch if name == STREAM or r[0] == name]
            samples += sum(1 for r in mine if r[3])
            tokens += sum(r[1] for r in mine)
            epochs = max([epochs] + [r[2] for r in mine])
            window += [r[1] for r in mine][-WINDOW:]
        targets = sum(r[4] for batches in ranks for batch in batches for r in batch if name == STREAM or r[0] == name)
        no_target = sum(1 for batches in ranks for batch in batches for i, r in enumerate(batch)
                        if (name == STREAM or r[0] == name) and has_no_target(batch, i))
        out[name] = {"samples_seen": samples, "tokens_seen": tokens, "epochs_completed": epochs,
                     "seq_len_window_size": len(window), "seq_len_mean": statistics.fmean(window),
                     "seq_len_p50": statistics.median(window), "target_tokens": targets, "no_target_docs": no_target}
    total = out[STREAM]
    for name, weight in weights.items():
        out[name]["share"] = out[name]["samples_seen"] / total["samples_seen"]
        out[name]["token_share"] = out[name]["tokens_seen"] / total["tokens_seen"]
        out[name]["target_weight"] = weight
    return out


def has_no_target(batch: Sequence[Record], index: int) -> bool:
    """Whether the document starting at piece ``index`` has no target label in the batch: its first piece and
    the pieces continuing it in the next rows (concat) hold none, and it does not run to the end of a batch
    that splits documents (it may go on, with targets, in a later batch)."""
    if not batch[index][3]:
        return False
    last = index
    while batch[last][4] == 0 and last + 1 < len(batch) and not batch[last + 1][3]:
        last += 1
    if any(r[4] for r in batch[index : last + 1]):
        return False
    return not (last == len(batch) - 1 and any(not r[3] for r in batch))


def assert_metrics_equal(got: dict[str, dict], want: dict[str, dict], where: str) -> None:
    """Every expected metric is present; counters exactly equal, ratios/statistics to float precision.

    Args:
        got: ``{name: {metric: value}}`` as logged / reported.
        want: Output of :func:`expected_metrics`.
        where: Context for failure messages.
    """
    for name, metrics in want.items():
        for metric, value in metrics.items():
            assert metric in got.get(name, {}), f"{where}: dataset/{name}/{metric} not reported"
            if metric in COUNTERS:
                assert got[name][metric] == value, f"{where}: dataset/{name}/{metric}"
            else:
                assert got[name][metric] == pytest.approx(value, rel=1e-12), f"{where}: dataset/{name}/{metric}"


def unflatten(row: dict[str, float]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for key, value in row.items():
        _, name, metric = key.split("/")
        out.setdefault(name, {})[metric] = value
    return out


def from_callback(metrics: dict[str, dict]) -> dict[str, dict]:
    return {name: entry["metrics"] for name, entry in metrics.items()}


def logged_steps(max_steps: int, log_every: int) -> list[int]:
    """Steps the callback logs at: every ``log_every`` steps, and the last step."""
    steps = [s for s in range(1, max_steps + 1) if s % log_every == 0]
    return steps if steps and steps[-1] == max_steps else [*steps, max_steps]


# --------------------------------------------------------------------------- 1. exact counts
@pytest.mark.parametrize("packing", [None, "best_fit", "concat"])
def test_logged_per_source_counts_equal_documents_in_trained_batches(small_corpus, tmp_path, packing):
    max_steps, log_every = 8, 3
    callback, recorder, logged = fit(small_corpus, tmp_path / "run", max_steps, packing, log_every)

    assert len(recorder.batches) == max_steps
    assert sorted(logged) == logged_steps(max_steps, log_every) == [3, 6, 8]
    for step, row in logged.items():
        want = expected_metrics([recorder.batches[:step]], WEIGHTS)
        assert_metrics_equal(unflatten(row), want, f"metrics.csv at step {step}")
    final = expected_metrics([recorder.batches], WEIGHTS)
    assert_metrics_equal(from_callback(callback.get_metrics()), final, "get_metrics()")

    # The run really exercises what the counters distinguish.
    pieces = [r for batch in recorder.batches for r in batch]
    assert {r[0] for r in pieces} == set(WEIGHTS), "both sources must appear"
    assert final["a"]["epochs_completed"] >= 1, "a source must wrap around into a new pass"
    assert final[STREAM]["seq_len_window_size"] == WINDOW < len(pieces), "the window must have slid"
    if packing == "concat":
        continuations = [r for r in pieces if not r[3]]
        assert continuations, "concat must split documents across blocks"
        assert final[STREAM]["samples_seen"] == len(pieces) - len(continuations)
    else:
        assert final[STREAM]["samples_seen"] == len(pieces)


# --------------------------------------------------------------------------- 2. resume
@pytest.mark.parametrize("packing", [None, "concat"])
def test_counters_continue_from_checkpoint_and_match_uninterrupted_run(small_corpus, tmp_path, packing):
    k, n, log_every = 4, 10, 2
    full_cb, full, full_logged = fit(small_corpus, tmp_path / "full", n, packing, log_every, ckpt_every=k)
    ckpt = next((tmp_path / "full" / "ckpt").glob(f"*step={k}.ckpt"))

    # The checkpoint holds the counts of the first k trained batches.
    state = torch.load(ckpt, map_location="cpu", weights_only=True)
    (cb_state,) = [v for key, v in state["callbacks"].items() if key.startswith("DatasetMetricsCallback")]
    saved = cb_state["ranks"][0]["collectors"]
    at_k = expected_metrics([full.batches[:k]], WEIGHTS)
    for name in (STREAM, *WEIGHTS):
        assert saved[name][0]["samples_seen"] == at_k[name]["samples_seen"], name
        assert saved[name][0]["tokens_seen"] == at_k[name]["tokens_seen"], name

    resumed_cb, resumed, resumed_logged = fit(small_corpus, tmp_path / "resumed", n, packing, log_every,
                                              ckpt_every=k, ckpt_path=str(ckpt))
    assert resumed.batches == full.batches[k:], "the resumed run must train on the same data"
    assert sorted(resumed_logged) == [6, 8, 10]
    for step in sorted(resumed_logged):
        assert resumed_logged[step] == full_logged[step], f"step {step}: resumed != uninterrupted"
        assert_metrics_equal(unflatten(resumed_logged[step]), expected_metrics([full.batches[:step]], WEIGHTS),
                             f"resumed metrics.csv at step {step}")
    # Continued, not restarted: the first logged value includes the k batches before the checkpoint.
    only_after = sum(1 for batch in resumed.batches[: 6 - k] for r in batch if r[3])
    assert resumed_logged[6][f"dataset/{STREAM}/samples_seen"] > only_after
    assert from_callback(resumed_cb.get_metrics()) == from_callback(full_cb.get_metrics())


def test_recent_window_shows_changed_weights_right_after_a_resume(small_corpus, tmp_path):
    # A run at a:b = 0.8:0.2 for 20 steps, resumed with 0.2:0.8 for one window (10 steps) more.
    def run(weights: dict[str, float], max_steps: int, ckpt_path: str | None) -> dict[int, dict[str, float]]:
        seed_everything(0)
        run_dir = tmp_path / ("second" if ckpt_path else "first")
        callbacks = [DatasetMetricsCallback(log_every_n_steps=10, window=10, print_summary=False),
                     ModelCheckpoint(dirpath=run_dir / "ckpt", every_n_train_steps=20, save_top_k=-1)]
        trainer = Trainer(accelerator="cpu", max_steps=max_steps, callbacks=callbacks, log_every_n_steps=10,
                          logger=CSVLogger(save_dir=run_dir, name="csv", version=0), limit_val_batches=0,
                          enable_progress_bar=False, enable_model_summary=False, default_root_dir=run_dir)
        datamodule = make_datamodule(small_corpus, None, num_workers=0, weights=weights)
        model = TinyCausalLM(vocab_size=datamodule.vocab_size, max_seq_len=64, d_model=16, n_layers=1, n_heads=2)
        with pytest.warns(UserWarning, match="weights changed") if ckpt_path else contextlib.nullcontext():
            trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
        return read_logged(run_dir / "csv" / "version_0" / "metrics.csv")

    first = run({"a": 0.8, "b": 0.2}, 20, None)
    assert first[20]["dataset/a/window_share"] == pytest.approx(0.8, abs=0.05)
    ckpt = next((tmp_path / "first" / "ckpt").glob("*step=20.ckpt"))
    second = run({"a": 0.2, "b": 0.8}, 30, str(ckpt))
    at_30 = second[30]
    assert at_30["dataset/a/target_weight"] == 0.2
    assert at_30["dataset/a/window_share"] == pytest.approx(0.2, abs=0.05), "the last window holds only new batches"
    assert at_30["dataset/a/share"] > 0.5, "the cumulative share still counts the 20 steps at 0.8"


# --------------------------------------------------------------------------- 3. DDP
@pytest.mark.slow
def test_ddp_logged_metrics_reduce_every_ranks_trained_batches(ddp_corpus, tmp_path):
    max_steps, log_every = 7, 3
    args = [sys.executable, str(DDP_SCRIPT), str(ddp_corpus), str(tmp_path), str(max_steps), "2", "best_fit",
            str(log_every), str(WINDOW)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    tokenizer = ByteTokenizer()
    batches = []
    for rank in ranks:
        assert rank["global_step"] == max_steps and len(rank["batches"]) == max_steps
        batches.append([records_of(rebuild(batch), tokenizer) for batch in rank["batches"]])
    assert batches[0] != batches[1], "the ranks must train on different data"

    logged = read_logged(tmp_path / "csv" / "version_0" / "metrics.csv")
    assert sorted(logged) == logged_steps(max_steps, log_every) == [3, 6, 7]
    for step, row in logged.items():
        want = expected_metrics([b[:step] for b in batches], WEIGHTS)
        assert_metrics_equal(unflatten(row), want, f"metrics.csv at step {step}")
        per_rank = [expected_metrics([b[:step]], WEIGHTS)[STREAM] for b in batches]
        assert want[STREAM]["samples_seen"] == sum(m["samples_seen"] for m in per_rank)
        for source in WEIGHTS:  # the recent window (100 batches) still covers every step of both ranks
            assert row[f"dataset/{source}/window_share"] == pytest.approx(want[source]["share"], rel=1e-12)
            assert row[f"dataset/{source}/window_token_share"] == pytest.approx(want[source]["token_share"], rel=1e-12)
    final = expected_metrics(batches, WEIGHTS)
    assert final[STREAM]["seq_len_window_size"] == 2 * WINDOW, "the statistics cover both ranks' full windows"
    # The data tells a reduction of windows from an average of per-rank medians apart.
    per_rank_p50 = [expected_metrics([b], WEIGHTS)[STREAM]["seq_len_p50"] for b in batches]
    assert final[STREAM]["seq_len_p50"] != pytest.approx(statistics.fmean(per_rank_p50))
    for rank in ranks:  # every rank gets the same global result
        assert_metrics_equal(rank["get_metrics"], final, f"rank {rank['rank']} get_metrics()")


def rebuild(batch: dict[str, Any]) -> dict[str, Any]:
    """A batch recorded as JSON by the DDP script, with its tensors restored."""
    return {k: (v if k == "provenance" else torch.tensor(v)) for k, v in batch.items()}


# --------------------------------------------------------------------------- 4. target weights
def test_cli_configured_callback_reports_datamodule_weights_as_targets(small_corpus, tmp_path):
    # Like configs/quickstart.yaml: the callback is configured with a logging interval only.
    config = f"""
seed_everything: 0
trainer:
  accelerator: cpu
  devices: 1
  max_steps: 4
  limit_val_batches: 0
  enable_progress_bar: false
  enable_model_summary: false
  enable_checkpointing: false
  default_root_dir: {tmp_path}
  logger:
    class_path: lightning.pytorch.loggers.CSVLogger
    init_args: {{save_dir: {tmp_path}, name: logs, version: 0}}
  callbacks:
    - class_path: lightning_tune_data.DatasetMetricsCallback
      init_args: {{log_every_n_steps: 2}}
model:
  class_path: lightning_tune_data.models.TinyCausalLM
  init_args: {{d_model: 16, n_layers: 1, n_heads: 2}}
data:
  max_seq_len: 64
  batch_size: 4
  num_workers: 0
  cache_dir: {small_corpus / "cache"}
  dataset_managers:
    train:
      a:
        class_path: lightning_tune_data.LocalDatasetManager
        init_args: {{data_files: {small_corpus / "a.jsonl"}, weight: 3}}
      b:
        class_path: lightning_tune_data.LocalDatasetManager
        init_args: {{data_files: {small_corpus / "b.jsonl"}, weight: 1}}
"""
    path = tmp_path / "config.yaml"
    path.write_text(config)
    cli = run_cli(["fit", "--config", str(path)])

    assert cli.datamodule.train_source_weights == {"a": 0.75, "b": 0.25}
    (callback,) = [c for c in cli.trainer.callbacks if isinstance(c, DatasetMetricsCallback)]
    reported = from_callback(callback.get_metrics())
    assert reported["a"]["target_weight"] == pytest.approx(0.75)
    assert reported["b"]["target_weight"] == pytest.approx(0.25)
    logged = read_logged(tmp_path / "logs" / "version_0" / "metrics.csv")
    assert sorted(logged) == [2, 4]
    for row in logged.values():
        assert row["dataset/a/target_weight"] == pytest.approx(0.75)
        assert row["dataset/b/target_weight"] == pytest.approx(0.25)
        assert row["dataset/a/share"] + row["dataset/b/share"] == pytest.approx(1.0)
