"""Who reads what: the process layout, per-epoch sample order, and equal per-rank batch plans.

Everything here is a pure function of (dataset layout, seed, epoch, world), so every rank computes
the same global order without communicating, and the order never depends on ``num_workers``.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Literal, Sequence

import numpy as np

from .errors import ConfigError, EmptyDatasetError

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
