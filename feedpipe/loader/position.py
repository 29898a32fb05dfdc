"""Where the next iteration of a loader starts: the epoch and the batches already yielded in it.

Shared by the torch and DALI backends so their ``state_dict()`` is one format: either backend
resumes the other's state.
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from ..sharding import World
from .config import LoaderConfig


class EpochPosition:
    """``set_epoch`` / ``state_dict`` / ``load_state_dict`` over ``_epoch`` and ``_consumed``."""

    cfg: LoaderConfig
    world: World
    _epoch: int = 0
    _consumed: int = 0

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch (and so the order) of the next iteration."""
        if epoch != self._epoch:
            self._epoch, self._consumed = int(epoch), 0

    def state_dict(self) -> dict[str, Any]:
        """Position to resume from: epoch and batches already yielded in it."""
        return {"epoch": self._epoch, "batches": self._consumed, "seed": self.cfg.seed,
                "rank": self.world.rank, "world_size": self.world.size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly after the last batch the saved loader yielded."""
        if state.get("seed") != self.cfg.seed or state.get("world_size") != self.world.size:
            raise ConfigError(f"state is for seed={state.get('seed')}, world_size="
                              f"{state.get('world_size')}; this loader has seed="
                              f"{self.cfg.seed}, world_size={self.world.size}")
        self._check_state(state)
        self._epoch, self._consumed = int(state["epoch"]), int(state["batches"])

    def _check_state(self, state: dict[str, Any]) -> None:
        """Backend-specific refusals, raised before the position changes."""
