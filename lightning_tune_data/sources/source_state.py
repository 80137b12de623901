"""Small pieces of state every indexed source shares: its counters and the shard-mismatch error."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from lightning_tune_data.distributed import ShardInfo

__all__ = ["SourceCounters", "shard_mismatch_error"]


@dataclass
class SourceCounters:
    """What a source shard skipped, by reason (all plain ints, saved with the state).

    ``errors``: samples whose transforms raised (within ``max_error_count``); ``filtered``:
    samples ``filter_fn`` rejected; ``overlong_truncated`` / ``overlong_dropped``: documents
    longer than ``max_seq_len``; ``empty_skipped``: documents with no tokens.
    """

    errors: int = 0
    filtered: int = 0
    overlong_truncated: int = 0
    overlong_dropped: int = 0
    empty_skipped: int = 0

    def state_dict(self) -> dict[str, int]:
        """Every count, as plain ints (fresh dict)."""
        return {
            "errors": int(self.errors),
            "filtered": int(self.filtered),
            "overlong_truncated": int(self.overlong_truncated),
            "overlong_dropped": int(self.overlong_dropped),
            "empty_skipped": int(self.empty_skipped),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the counts of ``state`` in place (a missing count is 0); the components of a source
        that count into this object keep counting into it.

        Args:
            state: what :meth:`state_dict` returned (``{}`` resets every count).
        """
        for field in fields(self):
            setattr(self, field.name, int(state.get(field.name, 0)))

    @classmethod
    def total(cls, states: list[dict[str, Any]]) -> SourceCounters:
        """The sum over several shards' counters (a resume with another layout keeps the totals).

        Args:
            states: one :meth:`state_dict` per shard.
        """
        return cls(**{f.name: sum(int(s.get(f.name, 0)) for s in states) for f in fields(cls)})

    def snapshot(self) -> dict[str, int]:
        """The counts now (what :meth:`since` compares with later)."""
        return self.state_dict()

    def since(self, before: dict[str, int]) -> str:
        """A readable summary of what was skipped since ``before`` (for the no-data error).

        Args:
            before: a :meth:`snapshot` taken earlier.
        """
        now = self.state_dict()
        labels = {
            "filtered": "filtered",
            "errors": "failed",
            "overlong_dropped": "overlong dropped",
            "empty_skipped": "empty",
        }
        return ", ".join(f"{label}: {now[key] - before.get(key, 0)}" for key, label in labels.items())


def shard_mismatch_error(source: str, saved_shard: int, saved_shards: int, shard: ShardInfo) -> ValueError:
    """The error for a shard state loaded into another shard (a layout change handled the wrong way).

    Args:
        source: the source's name.
        saved_shard, saved_shards: the shard that wrote the state, and how many shards there were.
        shard: the shard loading it.
    """
    return ValueError(
        f"Source '{source}': the state was written by shard {saved_shard} of {saved_shards} "
        f"(world_size x num_workers) but this is shard {shard.shard_id} of {shard.num_shards}. "
        "To resume with another number of ranks or workers, give every old shard's state to "
        "load_shard_states(); TextDataModule does this for you."
    )
