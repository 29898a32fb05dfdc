"""Where the next iteration of a loader starts: the epoch and the batches already yielded in it.

Shared by the torch and DALI backends so their ``state_dict()`` is one format: either backend
resumes the other's state. Torch semantics: every new ``iter()`` starts its epoch at the first
batch; only ``load_state_dict()`` makes the next iteration (once) start mid-epoch. A fully
consumed epoch moves the loader on to the next one.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..sharding import World
from .config import LoaderConfig


class EpochPosition:
    """``set_epoch`` / ``state_dict`` / ``load_state_dict`` over ``_epoch`` and ``_consumed``.

    ``_consumed`` counts the batches the latest iteration yielded (so ``state_dict()`` taken
    mid-iteration, or after a ``break``, is exact); ``_resume_at`` is the start a loaded state
    gives the next iteration.
    """

    cfg: LoaderConfig
    world: World
    _epoch: int = 0
    _consumed: int = 0
    _resume_at: int | None = None

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch (and so the order) of the next iteration."""
        if epoch != self._epoch:
            self._epoch, self._consumed, self._resume_at = int(epoch), 0, None

    def state_dict(self) -> dict[str, Any]:
        """Position to resume from: epoch and batches already yielded in it."""
        return {"epoch": self._epoch, "batches": self._consumed, "seed": self.cfg.seed,
                "rank": self.world.rank, "world_size": self.world.size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration continue exactly after the last batch the saved loader
        yielded (later iterations start their epoch from the first batch again)."""
        if state.get("seed") != self.cfg.seed or state.get("world_size") != self.world.size:
            raise ConfigError(f"state is for seed={state.get('seed')}, world_size="
                              f"{state.get('world_size')}; this loader has seed="
                              f"{self.cfg.seed}, world_size={self.world.size}")
        self._check_state(state)
        self._epoch, self._consumed = int(state["epoch"]), int(state["batches"])
        self._resume_at = self._consumed

    def _begin(self) -> tuple[int, int]:
        """(epoch, first batch) of an iteration that starts now; a loaded state is used once."""
        start, self._resume_at = self._resume_at or 0, None
        self._consumed = start
        return self._epoch, start

    def _check_state(self, state: dict[str, Any]) -> None:
        """Backend-specific refusals, raised before the position changes."""
