"""The resumable position both backends share: ``set_epoch`` / ``state_dict`` / ``load_state_dict``.

A state is global: the epoch, the seed, the epoch's order (:class:`OrderSpec`) and ``samples``,
how many samples of that epoch's global order all ranks together have consumed. A loader resumed
at any world size, batch size or ``num_workers`` reads exactly the rest of the epoch: the global
order from ``samples`` on, dealt round-robin to its ranks (:class:`~feedpipe.loader.sampler.
Segment`). Resumed at the saver's world and batch size, it continues the saver's own plan batch
for batch. The only samples read twice are the wrap-around padding of ``uneven="pad"`` at an
epoch's end (as without a resume); ``uneven="drop"`` and ``drop_last`` drop at the end as usual.
"""

from __future__ import annotations

from typing import Any

from ..dataset.mixed import MixedReader
from ..errors import ConfigError
from .config import LoaderConfig
from .mixing import mix_state
from .order import OrderSpec
from .sampler import PlanSampler, Segment, World, order_spec

STATE_KEYS = ("epoch", "batches", "seed", "rank", "world_size")  # every state has these


class EpochPosition:
    """``set_epoch`` / ``state_dict`` / ``load_state_dict`` over ``_epoch`` and ``_consumed``.

    ``_consumed`` counts the batches the latest iteration yielded (so ``state_dict()`` taken
    mid-iteration, or after a ``break``, is exact); ``_resume_at`` is the start a loaded state
    gives the next iteration, whose plan is ``sampler.resumed`` (None: the epoch's fresh plan).
    ``elastic`` False: the backend's order is not feedpipe's plan, so a state only resumes at the
    world size it was saved at.
    """

    cfg: LoaderConfig
    world: World
    sampler: PlanSampler
    elastic: bool = True
    _epoch: int = 0
    _consumed: int = 0
    _resume_at: int | None = None

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch (and so the order) of the next iteration."""
        if epoch != self._epoch:
            self._epoch, self._consumed, self._resume_at = int(epoch), 0, None
            self.sampler.resumed = None

    def state_dict(self) -> dict[str, Any]:
        """Position to resume from: the epoch, the samples of its global order consumed (with
        the order), and this rank's plan position (batches yielded, world and batch size)."""
        state = {"epoch": self._epoch, "batches": self._consumed, "seed": self.cfg.seed,
                 "rank": self.world.rank, "world_size": self.world.size, **self._mix_state()}
        if not self.elastic:
            return state
        seg = self.sampler.segment(self._epoch)
        order, start = (seg.order, seg.start) if seg else (self.sampler.order, 0)
        return {**state, "batch_size": self.cfg.batch_size, "order": order.to_dict(),
                "start": start,
                "samples": start + self.sampler.consumed(self._epoch, self._consumed)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next iteration continue exactly after the samples the saved loader's ranks
        consumed (later iterations start their epoch from the first batch again)."""
        missing = [k for k in STATE_KEYS if k not in state]
        if missing:
            raise ConfigError(f"not a feedpipe loader state: missing {missing}")
        if state.get("seed") != self.cfg.seed:
            raise ConfigError(f"state is for seed={state.get('seed')}; this loader has seed="
                              f"{self.cfg.seed}")
        if state.get("mix") != self._mix_state().get("mix"):
            raise ConfigError(f"state is for the mix {state.get('mix')}; this loader reads "
                              f"{self._mix_state().get('mix')}")
        self._check_state(state)
        epoch, batches, world = int(state["epoch"]), int(state["batches"]), state["world_size"]
        same = world == self.world.size and state.get("batch_size", self.cfg.batch_size) == \
            self.cfg.batch_size
        if "samples" not in state or not self.elastic:
            if not same:
                why = "it was saved before states became global (no 'samples')" \
                    if self.elastic else f"{self._order_name()} cannot be dealt anew"
                raise ConfigError(f"state was saved at world_size={world}; this loader has "
                                  f"world_size={self.world.size}, and {why}: resume it at "
                                  f"world_size={world}")
            # before shuffle_window, sharded data was shuffled by the buffer
            seg = Segment(epoch, order_spec(self.sampler.reader, self.cfg, self.world,
                                            window=None), 0)
        else:
            order, start = OrderSpec.from_dict(state.get("order")), _count(state, "start")
            samples = _count(state, "samples")
            if samples < start or samples > len(self.sampler.reader):
                raise ConfigError(f"state 'samples'={samples} is outside {start}.."
                                  f"{len(self.sampler.reader)} (start..dataset size)")
            if not same:  # re-deal what the saver's ranks had not read yet
                seg, batches = Segment(epoch, order, samples), 0
            else:  # the saver's own plan, from its next batch
                seg = Segment(epoch, order, start)
        fresh = seg.start == 0 and seg.order == self.sampler.order  # the epoch's own plan
        self._epoch, self._consumed, self._resume_at = epoch, batches, batches
        self.sampler.resumed = None if fresh or not self.elastic else seg

    def _mix_state(self) -> dict[str, Any]:
        """A mix's sources, weights and epoch size (feedpipe.loader.mixing); {} otherwise."""
        reader = self.sampler.reader
        return {"mix": mix_state(reader, self.cfg)} if isinstance(reader, MixedReader) else {}

    def _begin(self) -> tuple[int, int]:
        """(epoch, first batch) of an iteration that starts now; a loaded state is used once."""
        start, self._resume_at = self._resume_at, None
        if start is None:
            start, self.sampler.resumed = 0, None
        self._consumed = start
        return self._epoch, start

    def _check_state(self, state: dict[str, Any]) -> None:
        """Backend-specific refusals, raised before the position changes."""

    def _order_name(self) -> str:
        """What this loader's order is, for messages."""
        return "this order"


def _count(state: dict[str, Any], key: str) -> int:
    value = state.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"state {key!r}={value!r}: expected an int >= 0")
    return value
