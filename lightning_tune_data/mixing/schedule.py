"""The weighted draw rule of a mixture: which child comes next, and what each child has contributed.

Every child keeps an *account* of what the mixture drew from it: one count per unit of
:data:`~lightning_tune_data.keys.MIX_BY` (documents, tokens), in that order. A child's *lag* is its
account in the mixture's unit divided by its weight; each draw takes the child with the smallest
lag plus a random jitter of up to :data:`JITTER_DRAWS` draws' worth. The jitter comes from blocks
of uniforms seeded by ``(seed, mixture name, shard, block)``, so the whole state is the draw
counter plus the accounts: O(1) however long the stream runs.
"""

from __future__ import annotations

import logging
import math
import numbers
import zlib
from typing import Any

import numpy as np

from lightning_tune_data.distributed import current_shard
from lightning_tune_data.keys import MIX_BY, MixBy
from lightning_tune_data.settings import StreamSettings

__all__ = ["DrawSchedule", "check_weights", "BLOCK_SIZE", "JITTER_DRAWS", "DRAWS_KEY", "CONSUMED_KEY", "WEIGHTS_KEY", "MIX_BY_KEY"]

logger = logging.getLogger(__name__)

#: Draws per block of jitter uniforms (the generator is re-seeded per block, so the state is a counter).
BLOCK_SIZE = 256
#: How far (in draws' worth of data) the random jitter may reorder sources around their targets.
JITTER_DRAWS = 32

# State keys (entries of the mixture's state).
DRAWS_KEY = "draws"
CONSUMED_KEY = "consumed"
WEIGHTS_KEY = "weights"
MIX_BY_KEY = "mix_by"

#: Where an account holds its documents count and its tokens count.
_DOCUMENTS, _TOKENS = MIX_BY.index("documents"), MIX_BY.index("tokens")


def check_weights(mixture_name: str, names: list[str], weights: list[float]) -> None:
    """Refuse weights a mixture cannot draw by: each must be a finite number >= 0, their sum positive.

    Args:
        mixture_name: name of the mixture, for the messages.
        names: the children's names, in order.
        weights: one weight per child, as given.
    """
    for name, w in zip(names, weights):
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) or w < 0:
            raise ValueError(
                f"InterleavedDataset '{mixture_name}': weight {w!r} of child '{name}' is invalid; "
                "weights must be finite numbers >= 0."
            )
    if float(sum(weights)) <= 0:
        raise ValueError(
            f"InterleavedDataset '{mixture_name}': weights {dict(zip(names, weights))} sum to 0; "
            "give at least one child a positive weight."
        )


class DrawSchedule:
    """The draw counter, the children's accounts and the rule that picks the next child.

    Args:
        mixture_name: name of the mixture (part of the jitter's seed, and of messages).
        names: the children's names, in order.
        weights: one weight per child (checked by :func:`check_weights`); normalised to sum to 1,
            with a warning when they did not already.
        mix_by: what a weight is a share of: ``"documents"`` or ``"tokens"``.
        settings: supplies the seed and the rank and world size that, with the dataloader
            worker, pick this shard's jitter.
    """

    def __init__(self, mixture_name: str, names: list[str], weights: list[float], mix_by: MixBy,
                 settings: StreamSettings) -> None:
        total = float(sum(weights))
        self.mixture_name = mixture_name
        self.names = names
        self.weights = [float(w) / total for w in weights]
        if abs(total - 1.0) > 1e-6:
            logger.warning(
                "InterleavedDataset '%s' normalised weights %s (sum %.6g) to %s.",
                mixture_name, dict(zip(names, weights)), total,
                {n: round(w, 6) for n, w in zip(names, self.weights)},
            )
        self.mix_by = mix_by
        self.settings = settings
        self.unit = MIX_BY.index(mix_by)
        self.seed = int(settings.seed) % 2**64  # numpy seeds must be non-negative
        self.name_key = zlib.crc32(mixture_name.encode("utf-8"))
        self.draws = 0
        self.consumed: list[list[float]] = []
        self.total_tokens = 0.0
        self.reset()

    def reset(self) -> None:
        """Back to no draws and empty accounts (a new round)."""
        self.draws = 0
        self.consumed = [[0.0 for _ in MIX_BY] for _ in self.names]
        self.total_tokens = 0.0

    def load(self, draws: int, consumed: list[list[float]]) -> None:
        """Continue from ``draws`` draws with these accounts."""
        self.draws = draws
        self.consumed = consumed

    def start_counting(self) -> None:
        """Sum the accounts' tokens, which the token rule scales its jitter by (before any draw)."""
        self.total_tokens = sum(account[_TOKENS] for account in self.consumed)

    # -- drawing (once per document: keep it lean) ---------------------------------------------
    def candidates(self, active: list[int]) -> list[tuple[int, float]]:
        """``(child, 1 / weight)`` of the children a draw may pick (equal shares if only zero weights are left)."""
        weighted = [(i, 1.0 / self.weights[i]) for i in active if self.weights[i] > 0]
        return weighted or [(i, 1.0) for i in active]

    def block_uniforms(self, block: int) -> np.ndarray:
        """The jitter uniforms of draw block ``block`` of this shard: one row per draw, one column per child."""
        shard = current_shard(self.settings.rank, self.settings.world_size)
        rng = np.random.default_rng([self.seed, self.name_key, shard.num_shards, shard.shard_id, block])
        return rng.random((BLOCK_SIZE, len(self.names)))

    def draw(self, candidates: list[tuple[int, float]], uniforms: list[Any]) -> int:
        """One draw: the child the rule picks next. ``uniforms`` is the caller's
        ``[block index, rows]`` of jitter uniforms, refreshed here when the draw enters a new block."""
        block, row = divmod(self.draws, BLOCK_SIZE)
        if block != uniforms[0]:
            uniforms[0], uniforms[1] = block, self.block_uniforms(block).tolist()
        index = self.choose(candidates, uniforms[1][row])
        self.draws += 1
        return index

    def choose(self, candidates: list[tuple[int, float]], jitter_row: list[float]) -> int:
        """The candidate with the smallest lag plus jitter."""
        unit = self.unit
        per_draw = 1.0
        if unit == _TOKENS and self.draws:
            per_draw = max(1.0, self.total_tokens / self.draws)
        jitter = JITTER_DRAWS * per_draw
        consumed = self.consumed
        best, best_score = candidates[0][0], math.inf
        for i, inverse_weight in candidates:
            score = consumed[i][unit] * inverse_weight + jitter * jitter_row[i]
            if score < best_score:
                best, best_score = i, score
        return best

    def count(self, index: int, tokens: int) -> list[float]:
        """Add one drawn document of ``tokens`` tokens to child ``index``'s account; returns the account."""
        account = self.consumed[index]
        account[_DOCUMENTS] += 1
        account[_TOKENS] += tokens
        self.total_tokens += tokens
        return account

    # -- accounts in the saved state ------------------------------------------------------------
    def accounts_state(self, consumed: list[list[float]]) -> dict[str, dict[str, float]]:
        """``consumed`` by child name and unit, as the state saves it."""
        return {name: dict(zip(MIX_BY, account)) for name, account in zip(self.names, consumed)}

    def weights_state(self) -> dict[str, float]:
        """The weights by child name, as the state saves them."""
        return dict(zip(self.names, self.weights))

    def reweighted(self, saved_weights: dict[str, float]) -> bool:
        """Whether ``saved_weights`` (a state's) differ from this schedule's weights."""
        return any(abs(saved_weights.get(n, -1.0) - w) > 1e-9 for n, w in zip(self.names, self.weights))

    def warn_if_reweighted(self, own: dict[str, Any]) -> None:
        """Log that resuming this state with other weights continues differently from the saved run."""
        saved_weights = own.get(WEIGHTS_KEY, {})
        if saved_weights and self.reweighted(saved_weights):
            logger.warning(
                "InterleavedDataset '%s': the checkpoint was written with weights %s, resuming "
                "with %s; the continuation will differ from the uninterrupted run.",
                self.mixture_name, {n: round(w, 6) for n, w in saved_weights.items()},
                {n: round(w, 6) for n, w in self.weights_state().items()},
            )

    def saved_accounts(self, own: dict[str, Any]) -> list[list[float]]:
        """The accounts of a saved state, or zeros when it was written with other weights or
        another ``mix_by``: new weights apply from the resume on."""
        if own.get(MIX_BY_KEY, self.mix_by) != self.mix_by or self.reweighted(own.get(WEIGHTS_KEY, {})):
            return [[0.0 for _ in MIX_BY] for _ in self.names]
        consumed = own.get(CONSUMED_KEY, {})
        return [[float(consumed.get(n, {}).get(u, 0.0)) for u in MIX_BY] for n in self.names]

    def load_saved(self, own: dict[str, Any]) -> None:
        """Continue from a mixture's saved state of this layout (other weights restart the accounts)."""
        self.load(int(own[DRAWS_KEY]), self.saved_accounts(own))

    def timing_values(self) -> Any:
        """What a scheduled rule adds to a position's record (nothing here: the weights are fixed)."""
        return None

    def state_entries(self, timing: Any) -> dict[str, Any]:
        """What a scheduled rule adds to the mixture's state (nothing here)."""
        return {}

    # -- another layout of ranks and workers ----------------------------------------------------
    def merged(self, owns: list[dict[str, Any]]) -> dict[str, Any]:
        """The rule's part of the old shards' merged state: their accounts summed."""
        return {CONSUMED_KEY: self.merged_accounts(owns)}

    def merged_accounts(self, owns: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
        """The old shards' saved accounts summed by child and unit: what the old layout drew in all."""
        accounts = [self.saved_accounts(own) for own in owns]
        return {
            name: {unit: sum(account[i][u] for account in accounts) for u, unit in enumerate(MIX_BY)}
            for i, name in enumerate(self.names)
        }

    def take_share(self, merged: dict[str, Any]) -> None:
        """Start a round from this shard's equal part of :meth:`merged_accounts`' result."""
        num_shards = current_shard(self.settings.rank, self.settings.world_size).num_shards
        self.reset()
        consumed = merged[CONSUMED_KEY]
        self.consumed = [[float(consumed[n][unit]) / num_shards for unit in MIX_BY] for n in self.names]
