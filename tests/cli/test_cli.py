"""The ``lightning-tune-data`` CLI: real LightningCLI runs of fit/validate/test/predict from YAML.

One small config is generated per module (JSONL corpora, cache and run directories under a tmp
dir): two weighted train sources, two named val loaders, a test loader and an unconditional
predict loader. ``fit`` runs through the console path (``python -m lightning_tune_data``); the
other subcommands run in-process through ``run_cli`` on the checkpoint it wrote.
"""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import make_texts, write_jsonl

from lightning_tune_data.cli import run_cli
from lightning_tune_data.tokenizers import ByteTokenizer

REPO = Path(__file__).resolve().parents[2]
SHIPPED_CONFIGS = ["quickstart.yaml", "packed_concat.yaml", "finetune_prompt_completion.yaml"]
MAX_STEPS = 3
NUM_PREDICT_EXAMPLES = 2
GENERATE_TOKENS = 3

# run_cli(args) inside pytest: Lightning warns that sys.argv holds pytest's own arguments.
pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter is intended")


def manager(path: Path, **init_args) -> dict:
    return {"class_path": "lightning_tune_data.LocalDatasetManager", "init_args": {"data_files": str(path), **init_args}}


def small_config(root: Path) -> dict:
    """A few-step fit config over generated data; every path lies under ``root``."""
    data = root / "data"
    write_jsonl(data / "a.jsonl", make_texts(40, seed=1, prefix="A"))
    write_jsonl(data / "b.jsonl", make_texts(30, seed=2, prefix="B"))
    write_jsonl(data / "prose_val.jsonl", make_texts(8, seed=3, prefix="V"))
    write_jsonl(data / "sums_val.jsonl", [f"{i} + {i} = {2 * i}" for i in range(8)])
    run = root / "run"
    return {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_steps": MAX_STEPS,
            "val_check_interval": MAX_STEPS,
            "check_val_every_n_epoch": None,
            "limit_val_batches": 2,
            "log_every_n_steps": 1,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "default_root_dir": str(run),
            "logger": {"class_path": "lightning.pytorch.loggers.CSVLogger",
                       "init_args": {"save_dir": str(run), "name": "logs"}},
        },
        "model": {
            "class_path": "lightning_tune_data.models.TinyCausalLM",
            "init_args": {"d_model": 16, "n_layers": 1, "n_heads": 2, "generate_tokens": GENERATE_TOKENS},
        },
        "data": {
            "max_seq_len": 64,
            "batch_size": 4,
            "seed": 0,
            "cache_dir": str(root / "cache"),
            "packing": "greedy",
            "dataset_managers": {
                "train": {"a": manager(data / "a.jsonl", weight=0.7), "b": manager(data / "b.jsonl", weight=0.3)},
                "val": {"prose": manager(data / "prose_val.jsonl"), "sums": manager(data / "sums_val.jsonl")},
                "test": {"held_out": manager(data / "prose_val.jsonl")},
                "predict": {"unconditional": {
                    "class_path": "lightning_tune_data.UnconditionalGenerationDatasetManager",
                    "init_args": {"num_examples": NUM_PREDICT_EXAMPLES},
                }},
            },
        },
    }


def write_config(path: Path, config: dict) -> Path:
    # Kept outside every run's default_root_dir: LightningCLI saves the parsed config there as
    # config.yaml (overwrite=True) and would replace a config file living in that directory.
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def print_config(capsys, args: list[str]) -> dict:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        run_cli([*args, "--print_config"])
    assert exit_info.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


def read_metrics(metrics_csv: Path) -> dict[str, list[float]]:
    """Column -> the non-empty values logged in it, in order."""
    columns: dict[str, list[float]] = {}
    with metrics_csv.open(newline="") as handle:
        for row in csv.DictReader(handle):
            for key, value in row.items():
                if value not in ("", None):
                    columns.setdefault(key, []).append(float(value))
    return columns


@pytest.fixture(scope="module")
def cli_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    write_config(root / "configs" / "small.yaml", small_config(root))
    return root


@pytest.fixture(scope="module")
def fitted(cli_root: Path) -> dict:
    """``python -m lightning_tune_data fit --config small.yaml`` run once for the module."""
    result = subprocess.run(
        [sys.executable, "-m", "lightning_tune_data", "fit", "--config", str(cli_root / "configs" / "small.yaml")],
        cwd=cli_root, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    checkpoints = sorted((cli_root / "run").rglob("*.ckpt"))
    metrics_files = sorted((cli_root / "run").rglob("metrics.csv"))
    return {"result": result, "checkpoints": checkpoints, "metrics": metrics_files}


def eval_args(cli_root: Path, subcommand: str, checkpoint: Path) -> list[str]:
    return [subcommand, "--config", str(cli_root / "configs" / "small.yaml"), "--trainer.logger", "false",
            "--trainer.default_root_dir", str(cli_root / subcommand), "--ckpt_path", str(checkpoint)]


# -- help -----------------------------------------------------------------------------------------
def test_console_script_help_lists_the_lightning_and_the_data_subcommands():
    from lightning_tune_data.commands import COMMANDS, command_summary

    env = {**__import__("os").environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, "-m", "lightning_tune_data", "--help"], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: lightning-tune-data")
    listed = [line.split()[0] for line in result.stdout.split("Available subcommands:")[1].splitlines()
              if line.startswith("    ") and not line.startswith("      ")]
    assert listed == ["fit", "validate", "test", "predict", *COMMANDS]  # every registered command, from one place
    assert set(COMMANDS) >= {"cache", "report"}
    assert all(command_summary(name) and command_summary(name)[0].isupper() for name in COMMANDS)
    assert "LIGHTNING_TUNE_DATA_VERBOSE=1" in " ".join(result.stdout.split())


def test_tokenizer_help_accepts_the_short_class_name_and_lists_the_special_tokens_tried(capsys):
    from lightning_tune_data.tokenizers import DEFAULT_BOS_TOKENS, DEFAULT_EOS_TOKENS, DEFAULT_PAD_TOKENS

    for name in ("TokenizerFileTokenizer", "TransformersTokenizer"):
        with pytest.raises(SystemExit) as exit_info:
            run_cli(["fit", "--data.tokenizer.help", name])
        assert exit_info.value.code in (0, None)
        out = " ".join(capsys.readouterr().out.split())
        assert f"--data.tokenizer.help=lightning_tune_data.{name}" in out
        for token in (*DEFAULT_BOS_TOKENS, *DEFAULT_EOS_TOKENS, *DEFAULT_PAD_TOKENS):
            assert f"``{token}``" in out, f"{name} help does not say that {token} is tried"


@pytest.mark.parametrize("manager", ["DatasetManager", "LocalDatasetManager", "UnconditionalGenerationDatasetManager"])
def test_manager_help_describes_every_option_itself(manager, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(["fit", "--data.dataset_managers.help", manager])
    assert exit_info.value.code in (0, None)
    out = capsys.readouterr().out
    assert "See :class:" not in out
    assert "--data.dataset_managers.stages" in out
    if manager != "UnconditionalGenerationDatasetManager":
        assert "Relative sampling weight" in " ".join(out.split())


def test_fit_help_says_packing_buffer_size_counts_open_packs(capsys):
    with pytest.raises(SystemExit):
        run_cli(["fit", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    help_text = out.split("--data.packing_buffer_size PACKING_BUFFER_SIZE")[-1][:120]
    assert "open packs" in help_text and "documents the" not in help_text


def test_run_cli_fit_help_documents_the_datamodule_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(["fit", "--help"])
    assert exit_info.value.code in (0, None)
    out = capsys.readouterr().out
    for option in ("--data.dataset_managers", "--data.packing", "--data.max_seq_len", "--model"):
        assert option in out


# -- fit ------------------------------------------------------------------------------------------
def test_module_fit_from_a_config_trains_max_steps_and_writes_a_checkpoint_with_the_data_state(fitted):
    assert [p.name for p in fitted["checkpoints"]] == [f"epoch=0-step={MAX_STEPS}.ckpt"]
    checkpoint = torch.load(fitted["checkpoints"][0], map_location="cpu", weights_only=False)
    assert checkpoint["global_step"] == MAX_STEPS
    data_state = checkpoint["TextDataModule"]
    assert [rank["batches_consumed"] for rank in data_state["ranks"]] == [MAX_STEPS]
    assert data_state["signature"]["sources"] == ["a", "b"]


def test_module_fit_logs_train_loss_and_one_loss_per_named_val_loader(fitted):
    assert len(fitted["metrics"]) == 1
    metrics = read_metrics(fitted["metrics"][0])
    # Two train sources -> one stream named "interleaved"; val loaders keep their manager names.
    assert len(metrics["train/interleaved/loss"]) == MAX_STEPS
    assert all(math.isfinite(v) and v > 0 for v in metrics["train/interleaved/loss"])
    assert len(metrics["val/prose/loss"]) == 1 and len(metrics["val/sums/loss"]) == 1
    assert metrics["val/prose/loss"] != metrics["val/sums/loss"], "different val data must give different losses"
    assert not any(key.startswith("val/") and "dataloader_idx" in key for key in metrics)


def test_validate_from_the_fit_checkpoint_reproduces_the_val_losses_logged_by_fit(fitted, cli_root):
    logged = read_metrics(fitted["metrics"][0])
    cli = run_cli(eval_args(cli_root, "validate", fitted["checkpoints"][-1]))
    results = cli.trainer.callback_metrics
    for name in ("prose", "sums"):
        assert float(results[f"val/{name}/loss"]) == pytest.approx(logged[f"val/{name}/loss"][-1], rel=1e-5)


def test_test_subcommand_reports_the_loss_of_the_test_split_loader(fitted, cli_root):
    cli = run_cli(eval_args(cli_root, "test", fitted["checkpoints"][-1]))
    assert cli.datamodule.dataloader_names["test"] == ["held_out"]
    assert set(cli.trainer.callback_metrics) == {"test/held_out/loss"}
    assert math.isfinite(float(cli.trainer.callback_metrics["test/held_out/loss"]))


def test_predict_subcommand_generates_from_unconditional_bos_prompts(fitted, cli_root):
    cli = run_cli(eval_args(cli_root, "predict", fitted["checkpoints"][-1]))
    batches = cli.trainer.predict_loop.predictions
    rows = [row for batch in batches for row in batch]
    bos = ByteTokenizer().bos_id
    assert len(rows) == NUM_PREDICT_EXAMPLES
    for row in rows:
        assert row[0] == bos and len(row) == 1 + GENERATE_TOKENS
        assert all(isinstance(t, int) and 0 <= t < cli.model.hparams.vocab_size for t in row)


def test_fit_links_vocab_size_and_max_seq_len_from_the_datamodule_into_the_model(cli_root, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<s>", "</s>", "<pad>", "[UNK]", ":", "alpha", "beta", "gamma", "delta", "data", "stream"]
    word_level = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    word_level.save(str(tmp_path / "tokenizer.json"))
    config = small_config(tmp_path)
    config["data"]["tokenizer"] = {"class_path": "lightning_tune_data.TokenizerFileTokenizer",
                                   "init_args": {"path": str(tmp_path / "tokenizer.json")}}
    config["data"]["max_seq_len"] = 40
    config["trainer"].update(max_steps=1, limit_val_batches=0, logger=False, enable_checkpointing=False)
    path = write_config(tmp_path / "configs" / "linked.yaml", config)

    cli = run_cli(["fit", "--config", str(path)])

    assert cli.datamodule.vocab_size == len(words)
    assert cli.model.hparams.vocab_size == len(words) and cli.model.embed.num_embeddings == len(words)
    assert cli.model.hparams.max_seq_len == 40 and cli.model.positions.num_embeddings == 40
    assert cli.trainer.global_step == 1


# -- print_config and config errors ---------------------------------------------------------------
def test_fit_print_config_shows_the_dataset_managers_and_the_model(cli_root, capsys):
    printed = print_config(capsys, ["fit", "--config", str(cli_root / "configs" / "small.yaml")])
    train = printed["data"]["dataset_managers"]["train"]
    assert train["a"]["class_path"] == "lightning_tune_data.LocalDatasetManager"
    assert train["a"]["init_args"]["weight"] == 0.7 and train["b"]["init_args"]["weight"] == 0.3
    assert train["a"]["init_args"]["data_files"].endswith("a.jsonl")
    assert list(printed["data"]["dataset_managers"]["val"]) == ["prose", "sums"]
    predict = printed["data"]["dataset_managers"]["predict"]["unconditional"]
    assert predict["class_path"] == "lightning_tune_data.UnconditionalGenerationDatasetManager"
    assert printed["model"]["class_path"] == "lightning_tune_data.models.TinyCausalLM"
    assert printed["model"]["init_args"]["d_model"] == 16
    # Linked from the datamodule at instantiation, so not a model option of their own.
    assert "vocab_size" not in printed["model"]["init_args"]
    assert "max_seq_len" not in printed["model"]["init_args"]


@pytest.mark.parametrize("config_name", SHIPPED_CONFIGS)
def test_shipped_config_parses_and_names_a_metric_group_for_every_dataloader(config_name, capsys):
    path = REPO / "configs" / config_name
    printed = print_config(capsys, ["fit", "--config", str(path)])
    assert printed["model"]["class_path"] == "lightning_tune_data.models.TinyCausalLM"
    managers = printed["data"]["dataset_managers"]
    for split_managers in managers.values():
        for spec in (split_managers or {}).values():
            files = spec["init_args"].get("data_files")
            if files:
                assert (REPO / files).is_file(), f"{config_name}: {files} does not exist"
    train = list(managers["train"])
    train_name = train[0] if len(train) == 1 else printed["data"]["train_stream_name"]
    reported = printed["model"]["init_args"]["reported_metrics"]
    if reported is not None:
        assert list(reported["train"]) == [train_name]
        assert set(reported.get("val") or {}) == set(managers.get("val") or {})


def test_unknown_datamodule_key_in_the_config_fails_naming_the_key(cli_root, tmp_path, capsys):
    config = yaml.safe_load((cli_root / "configs" / "small.yaml").read_text())
    config["data"]["pakcing"] = "greedy"
    path = write_config(tmp_path / "bad_data.yaml", config)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(["fit", "--config", str(path)])
    assert exit_info.value.code == 2
    assert "pakcing" in capsys.readouterr().err


def test_unknown_manager_key_in_the_config_fails_naming_the_key_and_the_class(cli_root, tmp_path, capsys):
    config = yaml.safe_load((cli_root / "configs" / "small.yaml").read_text())
    config["data"]["dataset_managers"]["train"]["a"]["init_args"]["wieght"] = 0.5
    path = write_config(tmp_path / "bad_manager.yaml", config)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(["fit", "--config", str(path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "wieght" in err and "LocalDatasetManager" in err


def test_unknown_model_key_in_the_config_fails_naming_the_key(cli_root, tmp_path, capsys):
    config = yaml.safe_load((cli_root / "configs" / "small.yaml").read_text())
    config["model"]["init_args"]["d_modle"] = 32
    path = write_config(tmp_path / "bad_model.yaml", config)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(["fit", "--config", str(path)])
    assert exit_info.value.code == 2
    assert "d_modle" in capsys.readouterr().err


def test_duplicate_dataloader_name_in_the_yaml_fails_instead_of_silently_keeping_the_last(cli_root, tmp_path, capsys):
    text = (cli_root / "configs" / "small.yaml").read_text()
    config = yaml.safe_load(text)
    val = config["data"]["dataset_managers"]["val"]
    first_name = next(iter(val))
    duplicated = yaml.safe_dump(config, sort_keys=False).replace(
        "    val:\n", "    val:\n      " + first_name + ":\n        class_path: lightning_tune_data.LocalDatasetManager\n"
        "        init_args: {data_files: " + str(val[first_name]["init_args"]["data_files"]) + "}\n", 1
    )
    path = tmp_path / "duplicate.yaml"
    path.write_text(duplicated)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(["fit", "--config", str(path)])
    assert exit_info.value.code == 2
    assert f"duplicate key '{first_name}'" in capsys.readouterr().err


# -- a newcomer's errors and output ---------------------------------------------------------------
def run_main(args: list[str], capsys) -> tuple[int, str]:
    from lightning_tune_data.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    return exit_info.value.code, capsys.readouterr().err


def test_missing_data_file_fails_in_one_line_naming_the_config_path_of_the_source(cli_root, tmp_path, capsys):
    config = small_config(tmp_path)
    config["data"]["dataset_managers"]["train"]["a"]["init_args"]["data_files"] = str(tmp_path / "nope.jsonl")
    code, err = run_main(["fit", "--config", str(write_config(tmp_path / "cfg" / "bad.yaml", config))], capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1].startswith("lightning-tune-data: error: data.dataset_managers.train.a (LocalDatasetManager): ")
    assert "nope.jsonl" in lines[-1] and "Fix the paths in data_files" in lines[-1]
    assert "Traceback" not in err and "Expected a <class 'list'>" not in err


def test_failing_preprocess_import_names_the_source_by_its_config_name(tmp_path, capsys):
    config = small_config(tmp_path)
    config["data"]["dataset_managers"]["val"]["sums"]["init_args"]["preprocess_function"] = "no_such_module.tokenize"
    code, err = run_main(["fit", "--config", str(write_config(tmp_path / "cfg" / "bad.yaml", config))], capsys)
    assert code == 2
    assert err.strip().splitlines()[-1].startswith("lightning-tune-data: error: data.dataset_managers.val.sums ")
    assert "no_such_module" in err


def test_datamodule_config_errors_are_reported_with_their_field(tmp_path, capsys):
    config = small_config(tmp_path)
    config["data"]["max_seq_len"] = 1
    code, err = run_main(["fit", "--config", str(write_config(tmp_path / "cfg" / "bad.yaml", config))], capsys)
    assert code == 2
    assert "lightning-tune-data: error: data.max_seq_len: 1 is too small" in err


def test_console_script_imports_a_preprocess_module_from_the_working_directory(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_prep.py").write_text(
        "from lightning_tune_data.preprocess import tokenize_text\n"
        "def upper(examples, tokenizer):\n"
        "    return tokenize_text({'text': [t.upper() for t in examples['text']]}, tokenizer)\n"
    )
    config = small_config(project)
    config["data"]["dataset_managers"]["train"]["a"]["init_args"]["preprocess_function"] = "my_prep.upper"
    config["trainer"]["max_steps"] = 1
    config["trainer"]["val_check_interval"] = 1
    path = write_config(tmp_path / "cfg" / "custom.yaml", config)
    # A console script runs with its own folder, not the working directory, first on sys.path.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "lightning_tune_data_script.py").write_text("from lightning_tune_data.cli import main\nmain()\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run([sys.executable, str(bin_dir / "lightning_tune_data_script.py"), "fit", "--config", str(path)],
                            cwd=project, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Tokenizing source 'a'" in result.stderr


def test_print_config_shows_the_default_tokenizer(cli_root, capsys):
    config = print_config(capsys, ["fit", "--config", str(cli_root / "configs" / "small.yaml")])
    assert config["data"]["tokenizer"] == {"class_path": "lightning_tune_data.ByteTokenizer"}


def test_known_third_party_warnings_and_tips_are_filtered(caplog):
    import logging
    import warnings

    from lightning_tune_data.cli import _silence_known_noise

    _silence_known_noise()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        _silence_known_noise()
        warnings.warn("'set_vital' is deprecated, please do not call", UserWarning)
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", UserWarning)
        warnings.warn("a warning about the user's own setup", UserWarning)
    assert [str(w.message) for w in caught] == ["a warning about the user's own setup"]
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    with caplog.at_level(logging.INFO, logger=logger.name):
        logger.info("💡 Tip: For seamless cloud logging, try installing litlogger")
        logger.info("GPU available: False")
    assert [r.getMessage() for r in caplog.records] == ["GPU available: False"]


def test_predict_layered_on_a_fit_config_writes_decoded_predictions(fitted, cli_root, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # configs/predict.yaml writes runs/quickstart/predictions.jsonl
    cli = run_cli(["predict", "--config", str(cli_root / "configs" / "small.yaml"), "--config", str(REPO / "configs" / "predict.yaml"),
                   "--trainer.default_root_dir", str(tmp_path / "predict"), "--ckpt_path", str(fitted["checkpoints"][-1])])
    lines = [yaml.safe_load(line) for line in (tmp_path / "runs" / "quickstart" / "predictions.jsonl").read_text().splitlines()]
    assert [line["dataloader"] for line in lines] == ["unconditional"] * 8
    assert all(line["token_ids"][0] == ByteTokenizer().bos_id and isinstance(line["text"], str) for line in lines)
    assert (cli.model.temperature, cli.model.top_k) == (0.8, 40), "the predict config's sampling, not the checkpoint's"
    assert len({line["text"] for line in lines}) > 1, "8 BOS-only prompts must not give 8 identical samples"


def test_a_later_config_replaces_the_dataset_managers_mapping(capsys):
    config = print_config(capsys, ["predict", "--config", str(REPO / "configs" / "quickstart.yaml"),
                                   "--config", str(REPO / "configs" / "predict.yaml")])
    assert list(config["data"]["dataset_managers"]) == ["predict"]
    assert config["model"]["init_args"]["d_model"] == 64  # everything else is merged key by key
    assert (config["model"]["init_args"]["temperature"], config["model"]["init_args"]["top_k"]) == (0.8, 40)


def test_fit_storage_errors_are_one_line_with_exit_2_like_prepare(tmp_path, capsys, s3):
    from lightning_tune_data import prepare_task

    config = small_config(tmp_path)
    prepare_task(config["data"], 0, 2)  # a store whose task 1 never ran
    code, err = run_main(["fit", "--config", str(write_config(tmp_path / "cfg" / "half.yaml", config))], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert lines[-1].startswith("lightning-tune-data: error: data.dataset_managers.train.a (LocalDatasetManager, ")
    assert "task 1 of 2 has not finished. Run it" in lines[-1]

    config["data"].update(cache_dir=f"s3://{s3.bucket}-missing/x", storage_options=s3.storage_options,
                          build_stores="if_missing")
    code, err = run_main(["fit", "--config", str(write_config(tmp_path / "cfg" / "bucket.yaml", config))], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert lines[-1] == (f"lightning-tune-data: error: cache_dir s3://{s3.bucket}-missing/x: the bucket (or container) "
                         f"'{s3.bucket}-missing' does not exist; create it first, or fix cache_dir (and "
                         f"storage_options, e.g. endpoint_url).")
