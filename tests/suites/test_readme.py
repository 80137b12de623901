"""The README as a newcomer uses it: its Python snippet runs offline against generated data and
validates; its config layering and commands parse; its words are the user's."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from lightning_tune_data.cli import run_cli

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")

pytestmark = pytest.mark.filterwarnings("ignore:LightningCLI's args parameter is intended")

#: Run-length knobs shortened for the test; everything else in the snippet runs as written.
SHORTER_RUN = {"max_steps=1000": "max_steps=6", "val_check_interval=200": "val_check_interval=3"}


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.S)


def write_snippet_data(root: Path) -> None:
    """The files the 'Bring your own data' snippet names, with the columns it reads."""
    (root / "data" / "web").mkdir(parents=True)
    for part in range(2):
        rows = [{"content": f"web page {part}-{i}: " + "text " * (i % 7)} for i in range(40)]
        pq.write_table(pa.Table.from_pylist(rows), root / "data" / "web" / f"part-{part}.parquet")
    with (root / "data" / "sft.jsonl").open("w") as handle:
        for i in range(30):
            handle.write(json.dumps({"prompt": f"Q{i}: what is {i} + 1? ", "completion": f"{i + 1}"}) + "\n")
    with (root / "data" / "val.jsonl").open("w") as handle:
        for i in range(12):
            handle.write(json.dumps({"text": f"validation document {i}"}) + "\n")


def test_the_quickstart_and_test_lines_are_present_verbatim() -> None:
    bash = "\n".join(blocks("bash"))
    setup = 'python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e '
    assert setup + ". && lightning-tune-data fit --config configs/quickstart.yaml" in bash
    tools = "pip install --no-deps litdata==0.2.76 mosaicml-streaming==0.13.0 && "
    assert setup.replace("pip install -e ", tools + "pip install -e ") + '".[dev]" && python -m pytest -q -n 2' in bash


def ci_test_line() -> str:
    """The install-and-test command ``.ci/run`` runs (its last line)."""
    return (REPO / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()[-1]


def test_the_quick_test_line_comes_first_and_the_full_line_is_the_one_ci_runs_both_with_their_duration() -> None:
    full = ci_test_line()
    assert full.endswith("python -m pytest -q -n 2"), full
    quick = full + ' -m "not slow"'
    lines = [line for block in blocks("bash") for line in block.splitlines()]
    assert quick in lines and full in lines, "both test lines stand alone, verbatim"
    assert README.index(quick + "\n") < README.index(full + "\n"), "the quick line is shown first"
    for line in (quick, full):
        before = README[: README.index(line + "\n")].rsplit("```", 2)[-2]  # the text just above the command
        assert re.search(r"\d+ minutes on an?\s[\w\s]*2-core\smachine", before), f"no duration stated above {line!r}: {before!r}"


def test_the_quickstart_overlong_warning_is_quoted_as_measured_and_said_to_be_expected() -> None:
    from lightning_tune_data import ByteTokenizer

    config = yaml.safe_load((REPO / "configs" / "quickstart.yaml").read_text(encoding="utf-8"))
    max_seq_len = config["data"]["max_seq_len"]
    prose = config["data"]["dataset_managers"]["train"]["prose"]["init_args"]["data_files"]
    tokenizer = ByteTokenizer()
    lengths = [len(tokenizer.encode(json.loads(line)["text"])) + 2  # with BOS and EOS
               for line in (REPO / prose).read_text(encoding="utf-8").splitlines()]
    longer = sum(length > max_seq_len for length in lengths)
    quoted = (f"Train source 'prose': {longer:,} of {len(lengths):,} documents ({longer / len(lengths):.1%}) "
              f"are longer than max_seq_len={max_seq_len}")
    assert quoted in README
    paragraph = next(part for part in README.split("\n\n") if quoted in part and "expected" in part)
    assert "runs/quickstart/report" in paragraph or "truncat" in paragraph, "say why it is expected"
    assert "expected" in (REPO / "configs" / "quickstart.yaml").read_text(encoding="utf-8")


def test_commands_the_readme_gives_write_only_under_runs() -> None:
    outputs = re.findall(r"--output[ =](\S+?)[`\s]", README)
    assert outputs and all(path.startswith("runs/") for path in outputs), outputs  # runs/ is ignored by git


def test_bring_your_own_data_snippet_trains_and_validates_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    [snippet] = [block for block in blocks("python") if "TextDataModule(" in block]
    for long, short in SHORTER_RUN.items():
        assert long in snippet, f"the README snippet no longer contains {long!r}"
        snippet = snippet.replace(long, short)
    write_snippet_data(tmp_path)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(snippet, "README.md", "exec"), namespace)  # noqa: S102 - the documented code itself
    trainer = namespace["trainer"]
    assert trainer.global_step == 6
    assert "val/lm/loss" in trainer.callback_metrics  # a real validation run, not just the sanity check
    assert not [w for w in caught if "never triggers" in str(w.message)]
    assert set(namespace["dm"].train_source_weights) == {"web", "sft"}


def test_layering_example_changes_weights_and_keeps_every_manager(tmp_path: Path, capsys) -> None:
    [layer] = [block for block in blocks("yaml") if block.startswith("# more_prose.yaml")]
    (tmp_path / "more_prose.yaml").write_text(layer)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        run_cli(["fit", "--config", str(REPO / "configs" / "quickstart.yaml"), "--config", str(tmp_path / "more_prose.yaml"),
                 "--print_config"])
    managers = yaml.safe_load(capsys.readouterr().out)["data"]["dataset_managers"]
    assert {name: m["init_args"]["weight"] for name, m in managers["train"].items()} == {
        "prose": 0.8, "arithmetic": 0.1, "reverse": 0.1}
    assert managers["train"]["prose"]["init_args"]["data_files"] == "examples/data/prose_train.jsonl"
    assert list(managers["val"]) == ["lm", "arithmetic"]


def test_every_config_the_readme_names_exists() -> None:
    named = set(re.findall(r"--config (configs/[\w.]+\.yaml)", README))
    assert {"configs/quickstart.yaml", "configs/predict.yaml"} <= named
    assert all((REPO / path).is_file() for path in named)


FORBIDDEN = re.compile(r"seeds? ?0[0-9][0-9]|DESIGN|decision [0-9]|the issue", re.IGNORECASE)


def test_readme_and_package_speak_the_users_language() -> None:
    files = [REPO / "README.md", *(REPO / "lightning_tune_data").rglob("*.py")]
    offending = [f"{path.relative_to(REPO)}:{number}: {line.strip()}" for path in files
                 for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if FORBIDDEN.search(line)]
    assert offending == []
