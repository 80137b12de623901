"""The train data state a checkpoint carries: its layout, what can be resumed, and how.

Mental model: every rank's train loader records its state after each batch it hands out; the
checkpoint keeps, for every rank, the state after the last batch the model consumed (Lightning
prefetches one), gathered into rank 0's checkpoint because Lightning writes rank 0's only. On
resume, :class:`TrainResume` checks the checkpoint's data settings against the current ones and
holds the state until the train loader exists, then restores it:

* same layout (world size and ``num_workers``): each rank restores its own loader state, bitwise
  exact (a changed ``batch_size`` only regroups the same documents into batches);
* another layout: every old shard's stream state is merged and re-split
  (``TuneIterableDataset.load_shard_states``), so within the pass in progress every document is
  used exactly once across the old and the resumed run;
* changed sources, seed, ``max_seq_len``, packing, stopping strategy or train mode cannot be
  resumed: the error names them and the ``resume_data_state: false`` way out;
* changed weights or ``mix_by``: each source resumes where it was, the mix follows the new
  values (with a warning);
* a tokenized corpus whose files changed since the checkpoint (their size and ETag or
  modification time, recorded under :data:`CORPUS_FILES_KEY`) cannot be resumed: the error names
  the files, in the main process, before any dataloader worker starts.

The layout, written by :func:`data_state` and read by :class:`TrainResume` and
:func:`old_shard_states`::

    {VERSION_KEY: STATE_VERSION,
     SIGNATURE_KEY: {setting: value, ...},           # the datamodule's data_signature()
     RANKS_KEY: [{BATCHES_CONSUMED_KEY: int,         # one entry per rank, in rank order
                  LOADER_STATE_KEY: <ResumableLoader state>}, ...]}

Positions and document references only (plain Python types): no tensors, no data.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_warn

from lightning_tune_data.loading.resumable_loader import DATASET_KEY, LOADER_KEY, ResumableLoader
from lightning_tune_data.sources.arrow_state import saved_orders
from lightning_tune_data.sources.base import ElasticResumeUnsupported
from lightning_tune_data.sources.corpus_source import changed_files

__all__ = [
    "BATCHES_CONSUMED_KEY",
    "CORPUS_FILES_KEY",
    "FIXED_SETTINGS",
    "LAYOUT_SETTINGS",
    "LOADER_STATE_KEY",
    "MIX_SETTINGS",
    "RANKS_KEY",
    "RESUME_OPT_OUT",
    "SIGNATURE_KEY",
    "STATE_VERSION",
    "VERSION_KEY",
    "TrainResume",
    "data_signature",
    "data_state",
    "old_shard_states",
    "warn_data_state_ignored",
    "warn_no_data_state",
]

#: Keys of the data state.
VERSION_KEY = "version"
SIGNATURE_KEY = "signature"
RANKS_KEY = "ranks"
#: Keys of one rank's entry: the batches its model consumed, its train loader's state after them.
BATCHES_CONSUMED_KEY = "batches_consumed"
LOADER_STATE_KEY = "loader"

#: Version of the saved layout. 2: positions and document references only (resumable with another
#: world size, ``num_workers`` or ``batch_size``).
STATE_VERSION = 2
#: Data settings a checkpoint's position depends on; changing one cannot be resumed.
FIXED_SETTINGS = ("sources", "seed", "max_seq_len", "packing", "stopping_strategy", "train_mode")
#: Settings that split the stream into shards; changing one takes the elastic path.
LAYOUT_SETTINGS = ("world_size", "num_workers")
#: Settings that may change: the mix follows the new values from the resume on.
MIX_SETTINGS = ("weights", "mix_by", "mix_schedule")
#: Key of the signature holding each tokenized train corpus's files (``files_record``).
CORPUS_FILES_KEY = "corpus_files"
#: Opt-out named by every resume error.
RESUME_OPT_OUT = (
    "To keep the model, optimizer and step but start the train data from the beginning, set "
    "`resume_data_state: false` under `data:` (TextDataModule(resume_data_state=False))."
)

# The keys of torchdata's StatefulDataLoader state under which it keeps each worker's last
# snapshot. torchdata offers no public way to read one worker's dataset state out of a saved
# loader state, and the elastic resume needs exactly that (every old shard's stream position);
# this module is the one place that reads them, so a torchdata change shows up here only.
_TORCHDATA_SNAPSHOT = "_snapshot"
_TORCHDATA_WORKER_SNAPSHOTS = "_worker_snapshots"
_TORCHDATA_DATASET_STATE = "dataset_state"


def data_signature(
    *, sources: list[str], weights: dict[str, float], mix_by: str, seed: int, max_seq_len: int, batch_size: int,
    num_workers: int, world_size: int, packing: str | None, stopping_strategy: str, train_mode: str,
) -> dict[str, Any]:
    """The data settings a saved position depends on (compared on resume; see the module docstring).

    Args:
        sources: the train sources' names.
        weights: the train sources' normalised weights.
        mix_by, seed, max_seq_len, batch_size, num_workers, packing, stopping_strategy, train_mode:
            the datamodule's values of the same name.
        world_size: number of ranks.
    """
    return {
        "sources": sorted(sources),
        "weights": {name: round(weight, 12) for name, weight in weights.items()},
        "mix_by": mix_by,
        "seed": seed,
        "max_seq_len": max_seq_len,
        "batch_size": batch_size,
        "num_workers": num_workers,
        "world_size": world_size,
        "packing": packing,
        "stopping_strategy": stopping_strategy,
        "train_mode": train_mode,
    }


def data_state(
    loader: ResumableLoader, batches_consumed: int, signature: dict[str, Any], world_size: int
) -> dict[str, Any]:
    """The data state to save: every rank's loader state after its last consumed batch.

    Under DDP (``world_size > 1``) this is a collective: every rank's entry is gathered into
    every rank's state, because Lightning writes rank 0's checkpoint only.

    Args:
        loader: this rank's train loader.
        batches_consumed: batches this rank's model consumed (the state is the one after them).
        signature: the data settings the position depends on (compared on resume).
        world_size: number of ranks.
    """
    own = {BATCHES_CONSUMED_KEY: batches_consumed, LOADER_STATE_KEY: loader.state_after(batches_consumed)}
    ranks: list[Any] = [own]
    if world_size > 1:
        ranks = [None] * world_size
        dist.all_gather_object(ranks, own)
    return {VERSION_KEY: STATE_VERSION, SIGNATURE_KEY: signature, RANKS_KEY: ranks}


def warn_data_state_ignored() -> None:
    """Warn that a checkpoint's train data position is not restored (``resume_data_state=False``)."""
    rank_zero_warn(
        "resume_data_state=False: the checkpoint's train data position is ignored. The model, optimizer and "
        "step are restored, but the train data starts again from the beginning, so the model sees documents "
        "it has already trained on."
    )


def warn_no_data_state(owner: str, ckpt_path: Any) -> None:
    """Warn that the checkpoint a run resumes from holds no data state: the train data restarts.

    Args:
        owner: the datamodule's class name (the checkpoint key its state would be under).
        ckpt_path: the checkpoint the run resumes from.
    """
    rank_zero_warn(
        f"Resuming from {ckpt_path}, which holds no {owner} data state (written by another datamodule, or "
        "before the train loader existed): the train data starts from the beginning, so the batches differ "
        "from an uninterrupted run's."
    )


def _changes(saved: dict[str, Any], current: dict[str, Any], keys: tuple[str, ...], before: str = "") -> str:
    return "; ".join(f"{key}: {before}{saved.get(key)!r} -> {'now ' if before else ''}{current.get(key)!r}" for key in keys)


class TrainResume:
    """A checkpoint's train data state on its way from ``load_state_dict`` to the train loader.

    Args:
        enabled: restore a checkpoint's train data position (``False``: it is ignored, with a
            warning, and the train data starts from the beginning).

    Attributes:
        pending: the accepted state, until :meth:`restore` uses it.
        elastic: whether ``pending`` was written with another layout.
        origin: after an elastic restore, the old state (what to save while nothing new was consumed).
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.pending: dict[str, Any] | None = None
        self.elastic = False
        self.origin: dict[str, Any] | None = None

    def accept(self, state: dict[str, Any], signature: dict[str, Any], train_mode: str) -> None:
        """Check ``state`` against the current ``signature`` and keep it for :meth:`restore`.

        Args:
            state: the data state of a checkpoint (the layout of :func:`data_state`).
            signature: the current data settings (:func:`data_signature`).
            train_mode: ``"stream"`` or ``"map"`` (map-style data cannot change its layout).

        Raises:
            ValueError: the state cannot be resumed (another version, a changed setting it depends
                on, another layout of map-style data); the message names the way out.
        """
        if not self.enabled:
            warn_data_state_ignored()
            return
        if state.get(VERSION_KEY) != STATE_VERSION:
            raise ValueError(
                f"The checkpoint's train data state has version {state.get(VERSION_KEY)}, but this version of "
                f"lightning_tune_data reads version {STATE_VERSION} (positions and document references). It was "
                f"written by an older release and cannot be converted. {RESUME_OPT_OUT}"
            )
        saved = state[SIGNATURE_KEY]
        fixed = tuple(key for key in FIXED_SETTINGS if saved.get(key) != signature[key])
        if fixed:
            raise ValueError(
                f"Cannot resume the train data: the data config changed ({_changes(saved, signature, fixed, 'checkpoint ')}), "
                f"so the saved positions mean something else now. Restore those settings to resume. {RESUME_OPT_OUT}"
            )
        for source, now in (signature.get(CORPUS_FILES_KEY) or {}).items():
            problem = changed_files(source, (saved.get(CORPUS_FILES_KEY) or {}).get(source), now)
            if problem is not None:
                raise ValueError(problem)
        mix = tuple(key for key in MIX_SETTINGS if saved.get(key) != signature.get(key))
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

    def adopt_orders(self, datasets: dict[str, Any]) -> None:
        """Make the stores read shard by shard read in the pass orders the pending state was saved
        in (before the train stream is built from them): a resume continues the run's order, on a
        node with any budget that holds its window.

        Args:
            datasets: the train datasets by source name.

        Raises:
            ValueError: this node's budget cannot hold a saved window (naming the budget needed).
        """
        if self.pending is None:
            return
        try:
            orders = saved_orders(old_shard_states(self.pending))
        except (KeyError, TypeError, ValueError):  # an unusual state: the sources check it when they load it
            return
        for name, order in orders.items():
            adopt = getattr(datasets.get(name), "adopt_order", None)
            if adopt is not None:
                adopt(order)

    def restore(self, loader: ResumableLoader, dataset: Any, rank: int) -> int:
        """Give the pending state to this rank's new train loader; return the batches already consumed.

        Args:
            loader: this rank's new train loader (not iterated yet).
            dataset: the stream it reads (re-split from every old shard's state after a layout change).
            rank: this rank (the entry of the state it restores with the same layout).
        """
        state, self.pending = self.pending, None
        self.origin = None
        if state is None:
            return 0
        if not self.elastic:
            own = state[RANKS_KEY][rank]
            loader.restore(own[LOADER_STATE_KEY], own[BATCHES_CONSUMED_KEY])
            return int(own[BATCHES_CONSUMED_KEY])
        try:
            dataset.load_shard_states(old_shard_states(state))
        except ElasticResumeUnsupported as error:
            raise ValueError(
                f"Cannot resume the train data with a new number of ranks or workers: {error} {RESUME_OPT_OUT}"
            ) from None
        self.origin = state
        return 0


def old_shard_states(state: dict[str, Any]) -> list[dict[str, Any]]:
    """The train stream state of every shard (rank x dataloader worker) of a saved data state, in shard order.

    Args:
        state: a data state (the layout of :func:`data_state`).

    Raises:
        ValueError: a worker's snapshot holds no stream state (it cannot be re-split).
    """
    shards: list[dict[str, Any]] = []
    for rank, entry in enumerate(state[RANKS_KEY]):
        loader = entry[LOADER_STATE_KEY]
        if DATASET_KEY in loader:
            shards.append(loader[DATASET_KEY])
            continue
        snapshots = loader[LOADER_KEY].get(_TORCHDATA_SNAPSHOT, {}).get(_TORCHDATA_WORKER_SNAPSHOTS, {})
        for worker in range(len(snapshots)):
            dataset_state = snapshots[f"worker_{worker}"].get(_TORCHDATA_DATASET_STATE)
            if dataset_state is None:
                raise ValueError(
                    f"The checkpoint holds no train data state for worker {worker} of rank {rank}; it cannot be "
                    f"resumed with another layout. {RESUME_OPT_OUT}"
                )
            shards.append(dataset_state)
    return shards
