"""The train data position a checkpoint carries: what is saved, what can be resumed, and how.

Mental model: every rank's train loader records its state after each batch it hands out; the
checkpoint keeps, for every rank, the state after the last batch the model consumed (Lightning
prefetches one), gathered into rank 0's checkpoint because Lightning writes rank 0's only. On
resume, :class:`TrainResume` checks the checkpoint's data settings against the current ones and
holds the state until the train loader exists, then restores it:

* same layout (world size and ``num_workers``): each rank restores its own loader state, bitwise;
* another layout: every old shard's stream state is merged and re-split
  (``TuneIterableDataset.load_shard_states``), so within the pass in progress every document is
  used exactly once across the old and the resumed run.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from lightning_tune_data.loading.loaders import ResumableLoader
from lightning_tune_data.sources.base import ElasticResumeUnsupported

__all__ = ["STATE_VERSION", "FIXED_SETTINGS", "LAYOUT_SETTINGS", "RESUME_OPT_OUT", "TrainResume", "old_shard_states"]

#: Version of the saved layout. 2: positions and document references only (resumable with another
#: world size, ``num_workers`` or ``batch_size``).
STATE_VERSION = 2
#: Data settings a checkpoint's position depends on; changing one cannot be resumed.
FIXED_SETTINGS = ("sources", "seed", "max_seq_len", "packing", "stopping_strategy", "train_mode")
#: Settings that split the stream into shards; changing one takes the elastic path.
LAYOUT_SETTINGS = ("world_size", "num_workers")
#: Settings that may change: the mix follows the new values from the resume on.
MIX_SETTINGS = ("weights", "mix_by")
#: Opt-out named by every resume error.
RESUME_OPT_OUT = (
    "To keep the model, optimizer and step but start the train data from the beginning, set "
    "`resume_data_state: false` under `data:` (TextDataModule(resume_data_state=False))."
)


def _changes(saved: dict[str, Any], current: dict[str, Any], keys: tuple[str, ...], before: str = "") -> str:
    return "; ".join(f"{key}: {before}{saved.get(key)!r} -> {'now ' if before else ''}{current[key]!r}" for key in keys)


class TrainResume:
    """A checkpoint's train data state on its way from ``load_state_dict`` to the train loader.

    Attributes:
        pending: the accepted state, until :meth:`restore` uses it.
        elastic: whether ``pending`` was written with another layout.
        origin: after an elastic restore, the old state (what to save while nothing new was consumed).
    """

    def __init__(self) -> None:
        self.pending: dict[str, Any] | None = None
        self.elastic = False
        self.origin: dict[str, Any] | None = None

    def accept(self, state: dict[str, Any], signature: dict[str, Any], train_mode: str) -> None:
        """Check ``state`` against the current ``signature`` and keep it; raise if it cannot be resumed."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"The checkpoint's train data state has version {state.get('version')}, but this version of "
                f"lightning_tune_data reads version {STATE_VERSION} (positions and document references). It was "
                f"written by an older release and cannot be converted. {RESUME_OPT_OUT}"
            )
        saved = state["signature"]
        fixed = tuple(key for key in FIXED_SETTINGS if saved.get(key) != signature[key])
        if fixed:
            raise ValueError(
                f"Cannot resume the train data: the data config changed ({_changes(saved, signature, fixed, 'checkpoint ')}), "
                f"so the saved positions mean something else now. Restore those settings to resume. {RESUME_OPT_OUT}"
            )
        mix = tuple(key for key in MIX_SETTINGS if saved.get(key) != signature[key])
        if mix:
            rank_zero_warn(
                f"Train source weights changed ({_changes(saved, signature, mix)}). Resuming each source where it was; "
                "the mix follows the new weights from here on, so batches after the resume differ from the original run's."
            )
        layout = tuple(key for key in LAYOUT_SETTINGS if saved.get(key) != signature[key])
        if layout and train_mode != "stream":
            raise ValueError(
                f"Cannot resume train_mode='map' data with another layout ({_changes(saved, signature, layout)}); "
                f"resume with the checkpoint's layout. {RESUME_OPT_OUT}"
            )
        regrouped = tuple(key for key in (*LAYOUT_SETTINGS, "batch_size") if saved.get(key) != signature[key])
        if regrouped:
            rank_zero_warn(
                f"Resuming the train data with a new layout ({_changes(saved, signature, regrouped)}): within the pass "
                "in progress every document is used exactly once across the old and the resumed run, but the batches "
                "differ from an uninterrupted run's."
            )
        self.pending, self.elastic, self.origin = state, bool(layout), None

    def restore(self, loader: ResumableLoader, dataset: Any, rank: int) -> int:
        """Give the pending state to this rank's new train loader; return the batches already consumed."""
        state, self.pending = self.pending, None
        self.origin = None
        if state is None:
            return 0
        if not self.elastic:
            own = state["ranks"][rank]
            loader.restore(own["loader"], own["batches_consumed"])
            return int(own["batches_consumed"])
        try:
            dataset.load_shard_states(old_shard_states(state))
        except ElasticResumeUnsupported as error:
            raise ValueError(
                f"Cannot resume the train data with a new number of ranks or workers: {error} {RESUME_OPT_OUT}"
            ) from None
        self.origin = state
        return 0


def old_shard_states(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The train stream state of every shard (rank x dataloader worker) of a saved data state, in shard order."""
    shards: list[dict[str, Any]] = []
    for rank, entry in enumerate(state["ranks"]):
        loader = entry["loader"]
        if "dataset" in loader:
            shards.append(loader["dataset"])
            continue
        snapshots = loader["loader"].get("_snapshot", {}).get("_worker_snapshots", {})
        for worker in range(len(snapshots)):
            dataset_state = snapshots[f"worker_{worker}"].get("dataset_state")
            if dataset_state is None:
                raise ValueError(
                    f"The checkpoint holds no train data state for worker {worker} of rank {rank}; it cannot be "
                    f"resumed with another layout. {RESUME_OPT_OUT}"
                )
            shards.append(dataset_state)
    return shards
