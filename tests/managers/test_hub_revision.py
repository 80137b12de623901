"""Hub sources are pinned to one commit for every task of a store, through the real
``huggingface_hub`` / ``datasets`` code path against a local stand-in of the hub (no network)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hub_stand_in import COMMITS, REPO, HubStandIn

from lightning_tune_data.cache.root import StoreRoot
from lightning_tune_data.cache.store_files import StoreFiles
from lightning_tune_data.managers import DataSourceError
from lightning_tune_data.managers.hub_revision import SOURCE_PIN, pinned_revision, resolve_revision

# Two tasks of one store; the hub's main branch moves between them. The huggingface_hub endpoint
# is read when it is imported, so this runs in a process that starts with HF_ENDPOINT set.
SCENARIO = """
import sys
from pathlib import Path
from lightning_tune_data.managers import DatasetManager
from lightning_tune_data.managers.store_task import run_store_task
from lightning_tune_data.tokenizers import ByteTokenizer

cache, moved = Path(sys.argv[1]), Path(sys.argv[2])
def source():
    manager = DatasetManager(path="owner/corpus", split="train")
    manager.source_name = "corpus"
    return manager
print("TASK", run_store_task(source(), ByteTokenizer(), cache, 0, 2))
moved.touch()
print("TASK", run_store_task(source(), ByteTokenizer(), cache, 1, 2))
rows = source().setup(ByteTokenizer(), cache)
print("TEXTS", [bytes(r[1:-1]).decode() for r in rows["input_ids"]])
"""


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    stand_in = HubStandIn(tmp_path / "moved")
    monkeypatch.setenv("HF_ENDPOINT", stand_in.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HF_DATASETS_CACHE"):
        monkeypatch.delenv(name, raising=False)
    yield stand_in
    stand_in.close()


def test_tasks_of_a_store_read_the_commit_the_first_task_resolved_though_the_hub_moved(
        tmp_path: Path, hub: HubStandIn) -> None:
    result = subprocess.run([sys.executable, "-c", SCENARIO, str(tmp_path / "cache"), str(tmp_path / "moved")],
                            capture_output=True, text=True, timeout=240, env=dict(os.environ))
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if line.startswith(("TASK", "TEXTS"))]
    assert ", store committed at " in lines[1], lines
    texts = json.loads(lines[2][len("TEXTS "):].replace("'", '"'))
    assert texts == COMMITS["a" * 40]  # every row of the first commit, once; none of the second
    assert any(path.endswith("/train.jsonl") and "a" * 40 in path for path in hub.paths)
    assert not any("resolve/" + "b" * 40 in path for path in hub.paths)


def test_the_pin_is_recorded_once_and_an_unknown_revision_names_the_source(
        tmp_path: Path, hub: HubStandIn) -> None:
    files = StoreFiles(StoreRoot(str(tmp_path / "cache")), "corpus-0123")
    assert pinned_revision(files, REPO, None, "source 'corpus'") == "a" * 40
    (tmp_path / "moved").touch()
    assert resolve_revision(REPO, None, "source 'corpus'") == "b" * 40  # the hub moved ...
    assert pinned_revision(files, REPO, None, "source 'corpus'") == "a" * 40  # ... the store did not
    assert files.read_json(SOURCE_PIN) == {"repo_id": REPO, "requested": None, "revision": "a" * 40}
    with pytest.raises(DataSourceError, match=r"source 'corpus': cannot resolve revision 'v9' of hub dataset "
                                              r"'owner/corpus' to a commit .*load_kwargs\.revision"):
        resolve_revision(REPO, "v9", "source 'corpus'")


def test_offline_nothing_is_resolved(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_revision(REPO, None, "source 'corpus'") is None
