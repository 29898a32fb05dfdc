"""Who reads what, shared by both backends: the process layout, per-epoch sample order, equal
per-rank batch plans (:class:`PlanSampler`) and the resumable position (:class:`EpochPosition`).

Everything here is a pure function of (dataset layout, seed, epoch, world), so every rank computes
the same global order without communicating, and the order never depends on ``num_workers``.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Literal, Protocol, Sequence

import numpy as np
from torch.utils.data import Sampler

from ..dataset.formats.base import DatasetReader
from ..errors import ConfigError, EmptyDatasetError
from .config import LoaderConfig

Uneven = Literal["pad", "drop"]


@dataclass(frozen=True)
class World:
    """This process's rank among ``size`` data-parallel processes."""

    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ConfigError(f"invalid world: rank {self.rank} of {self.size}")

    @classmethod
    def detect(cls) -> "World":
        """torch.distributed when initialized, else RANK/WORLD_SIZE, else a single process."""
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                return cls(dist.get_rank(), dist.get_world_size())
        except ImportError:  # torch without distributed support
            pass
        return cls(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)))


def rng_for(*key: int) -> np.random.Generator:
    """A generator determined only by the non-negative integer key (seed, epoch, ...)."""
    return np.random.Generator(np.random.Philox(np.random.SeedSequence([int(k) for k in key])))


def shuffle_buffer(stream: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """The order a WebDataset-style shuffle buffer of ``size`` produces from ``stream``."""
    if size <= 1 or len(stream) <= 1:
        return stream.copy()
    out = np.empty_like(stream)
    buf = list(stream[:size])
    picks = rng.integers(0, 1 << 62, size=len(stream))
    k = 0
    for item in stream[size:]:
        j = int(picks[k] % len(buf))
        out[k] = buf[j]
        buf[j] = item
        k += 1
    rest = np.asarray(buf, dtype=stream.dtype)
    rng.shuffle(rest)
    out[k:] = rest
    return out


def rank_streams(n: int, world: World, *, seed: int, epoch: int, shuffle: bool,
                 shards: Sequence[range] | None = None, buffer: int = 1000) -> list[np.ndarray]:
    """Each rank's sample indices for one epoch (before equalizing lengths).

    Map-style data: one seeded permutation, dealt round-robin to ranks. Sharded data: a seeded
    shard shuffle, whole shards dealt to ranks, then a seeded shuffle buffer within each rank;
    with fewer shards than ranks it falls back to sample-level splitting and warns.
    """
    rng = rng_for(seed, epoch)
    if shards is None or len(shards) == 0:
        order = rng.permutation(n) if shuffle else np.arange(n)
        return [order[r:: world.size] for r in range(world.size)]
    shard_order = rng.permutation(len(shards)) if shuffle else np.arange(len(shards))
    if len(shards) < world.size:
        warnings.warn(f"{len(shards)} shards for {world.size} ranks: splitting by sample instead "
                      "of by shard (write more, smaller shards to keep reads shard-local)",
                      stacklevel=3)
        flat = np.concatenate([np.arange(shards[s].start, shards[s].stop) for s in shard_order])
        if shuffle:
            flat = shuffle_buffer(flat, buffer, rng)
        return [flat[r:: world.size] for r in range(world.size)]
    streams = []
    for r in range(world.size):
        mine = shard_order[r:: world.size]
        flat = np.concatenate([np.arange(shards[s].start, shards[s].stop, dtype=np.int64)
                               for s in mine]) if len(mine) else np.zeros(0, np.int64)
        if shuffle:
            flat = shuffle_buffer(flat, buffer, rng_for(seed, epoch, r + 1))
        streams.append(flat)
    return streams


def plan_batches(streams: list[np.ndarray], rank: int, batch_size: int, *, drop_last: bool,
                 uneven: Uneven) -> list[np.ndarray]:
    """This rank's batches, with exactly the same count on every rank.

    ``uneven="pad"`` tops short ranks up by wrapping around their own stream (every sample is seen);
    ``"drop"`` trims long ranks to the shortest. ``drop_last`` drops the final partial batch.
    """
    lengths = [len(s) for s in streams]
    target = max(lengths) if uneven == "pad" else min(lengths)
    mine = streams[rank]
    if target > len(mine):
        if len(mine) == 0:
            raise EmptyDatasetError(f"rank {rank} has no samples to pad from; use fewer ranks or "
                                    "more data")
        mine = np.resize(mine, target)  # wrap-around repeat
    mine = mine[:target]
    count = target // batch_size if drop_last else -(-target // batch_size)
    return [mine[b * batch_size: (b + 1) * batch_size] for b in range(count)]


# --- position: where the next iteration starts ----------------------------------------------------

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


# --- the batch plan both backends iterate ---------------------------------------------------------

class Slots(Protocol):
    """A ring of output buffers (the torch backend's SlotRing): the slot a batch is written into."""

    def acquire(self) -> int: ...


class BatchRequest(list):
    """The indices of one batch, what makes its augmentation deterministic, and the ring slot
    (-1: none free) its images are written into."""

    def __init__(self, indices: Sequence[int] | np.ndarray, epoch: int, number: int, rank: int,
                 slot: int = -1) -> None:
        super().__init__(int(i) for i in indices)
        self.epoch, self.number, self.rank, self.slot = epoch, number, rank, slot

    def __reduce__(self) -> tuple[Any, ...]:
        return BatchRequest, (list(self), self.epoch, self.number, self.rank, self.slot)


class PlanSampler(Sampler[BatchRequest]):
    """Both backends' batch order: this rank's batches for the current epoch, from ``start``
    (for resume); sharded formats keep each rank on whole shards."""

    def __init__(self, reader: DatasetReader, cfg: LoaderConfig, world: World) -> None:
        self.reader, self.cfg, self.world = reader, cfg, world
        self.shards = reader.shard_ranges()
        self.epoch, self.start = 0, 0
        self.ring: Slots | None = None
        self._cache: tuple[int, list[np.ndarray]] | None = None

    def plan(self, epoch: int) -> list[np.ndarray]:
        """All of this rank's batches (index arrays) for ``epoch``."""
        if self._cache is None or self._cache[0] != epoch:
            with warnings.catch_warnings():
                warnings.simplefilter("always" if epoch == 0 else "ignore")
                streams = rank_streams(len(self.reader), self.world, seed=self.cfg.seed,
                                       epoch=epoch, shuffle=self.cfg.shuffle, shards=self.shards,
                                       buffer=self.cfg.shuffle_buffer)
            self._cache = (epoch, plan_batches(streams, self.world.rank, self.cfg.batch_size,
                                               drop_last=self.cfg.drop_last,
                                               uneven=self.cfg.uneven))
        return self._cache[1]

    def __iter__(self) -> Iterator[BatchRequest]:
        plan = self.plan(self.epoch)
        for b in range(self.start, len(plan)):
            slot = self.ring.acquire() if self.ring is not None else -1
            yield BatchRequest(plan[b], self.epoch, b, self.world.rank, slot)

    def __len__(self) -> int:
        return len(self.plan(self.epoch)) - self.start
