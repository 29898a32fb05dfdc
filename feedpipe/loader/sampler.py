"""Who reads what, shared by both backends: the process layout, equal per-rank batch plans
(:class:`PlanSampler`) dealt from each epoch's global order (:mod:`feedpipe.loader.order`).

Everything here is a pure function of (dataset layout, seed, epoch, world), so every rank computes
the same global order without communicating, and the order never depends on ``num_workers``.

The seam, for any order (a mix of datasets included): an :class:`~feedpipe.loader.order.OrderSpec`
builds an epoch's streams; their interleaving is the epoch's global order; a fresh epoch gives
rank r stream r, a resumed one (:class:`Segment`) deals the unread rest of the global order
round-robin; :func:`plan_batches` equalizes and batches. A position is then one number, the
samples of the global order consumed (:mod:`feedpipe.loader.position`).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any, Iterator, Literal, Protocol, Sequence

import numpy as np
from torch.utils.data import Sampler

from ..dataset.formats.base import DatasetReader
from ..dataset.mixed import MixedReader
from ..errors import ConfigError, EmptyDatasetError
from .config import LoaderConfig
from .mixing import mix_order
from .order import OrderSpec, consumed, interleave, rng_for, shuffle_buffer

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


# --- the batch plan both backends iterate ---------------------------------------------------------

class Slots(Protocol):
    """A ring of output buffers (the torch backend's SlotRing): the slot a batch is written into."""

    def acquire(self) -> int: ...


class BatchRequest(list):
    """The indices of one batch, what makes its augmentation deterministic, and the ring slot
    (-1: none free) its images are written into."""

    def __init__(self, indices: Sequence[int] | np.ndarray, epoch: int, number: int, rank: int,
                 slot: int = -1) -> None:
        # (a plan's index array converts in one call: the main process builds one per batch)
        super().__init__(indices.tolist() if isinstance(indices, np.ndarray) else map(int, indices))
        self.epoch, self.number, self.rank, self.slot = epoch, number, rank, slot

    def __reduce__(self) -> tuple[Any, ...]:
        return BatchRequest, (list(self), self.epoch, self.number, self.rank, self.slot)



@dataclass(frozen=True)
class Segment:
    """A resumed iteration's plan: ``epoch``'s global order as ``order`` builds it, dealt anew to
    this world from sample ``start`` of that order on (the samples before it were consumed)."""

    epoch: int
    order: OrderSpec
    start: int


def order_spec(reader: DatasetReader, cfg: LoaderConfig, world: World, *,
               window: int | None | Literal["config"] = "config") -> OrderSpec:
    """The order a fresh epoch of this loader follows (``window`` overrides the config's, e.g.
    None for the shuffle-buffer order of states saved before ``shuffle_window`` existed)."""
    if not reader.shard_ranges():
        return OrderSpec(cfg.shuffle, 1, None, 0)  # map-style: the same order at any world size
    return OrderSpec(cfg.shuffle, world.size, cfg.shuffle_window if window == "config" else window,
                     cfg.shuffle_buffer)


class PlanSampler(Sampler[BatchRequest]):
    """Both backends' batch order: this rank's batches for the current epoch, from ``start``
    (for resume); sharded formats keep each rank on whole shards.

    A fresh epoch gives rank r stream r of :attr:`order`; ``resumed`` (set by
    :class:`~feedpipe.loader.position.EpochPosition` for the iteration a loaded state resumes)
    deals the rest of that epoch's global order round-robin instead.
    """

    def __init__(self, reader: DatasetReader, cfg: LoaderConfig, world: World) -> None:
        self.reader, self.cfg, self.world = reader, cfg, world
        self.shards = reader.shard_ranges()
        self.order = order_spec(reader, cfg, world)
        self.epoch, self.start = 0, 0
        self.resumed: Segment | None = None
        self.ring: Slots | None = None
        self._cache: tuple[tuple[int, Segment | None], list[np.ndarray], list[int]] | None = None

    def segment(self, epoch: int) -> Segment | None:
        """The resumed segment when it is for ``epoch``; None: the epoch's fresh plan."""
        return self.resumed if self.resumed is not None and self.resumed.epoch == epoch else None

    def _build(self, epoch: int) -> tuple[list[np.ndarray], list[int]]:
        """(this rank's batches, every rank's count of real samples) for ``epoch``."""
        seg = self.segment(epoch)
        spec, start = (seg.order, seg.start) if seg else (self.order, 0)
        with warnings.catch_warnings():
            warnings.simplefilter("always" if epoch == 0 and seg is None else "ignore")
            if isinstance(self.reader, MixedReader):  # one global order (spec.streams is 1)
                streams = [mix_order(self.reader, self.cfg, epoch)]
            else:
                streams = spec.build(len(self.reader), self.shards, seed=self.cfg.seed,
                                     epoch=epoch)
        size = self.world.size
        if start or spec.streams != size:  # deal the global order (from ``start``) round-robin
            rest = interleave(streams)[start:]
            streams = [rest[r::size] for r in range(size)]
        batches = plan_batches(streams, self.world.rank, self.cfg.batch_size,
                               drop_last=self.cfg.drop_last, uneven=self.cfg.uneven)
        return batches, [len(s) for s in streams]

    def _cached(self, epoch: int) -> tuple[list[np.ndarray], list[int]]:
        key = (epoch, self.segment(epoch))
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, *self._build(epoch))
        return self._cache[1], self._cache[2]

    def plan(self, epoch: int) -> list[np.ndarray]:
        """All of this rank's batches (index arrays) for ``epoch``."""
        return self._cached(epoch)[0]

    def consumed(self, epoch: int, batches: int) -> int:
        """Samples of ``epoch``'s global order that ``batches`` batches on every rank have read,
        counted from the plan's start (padding repeats are not counted)."""
        return consumed(self._cached(epoch)[1], batches * self.cfg.batch_size)

    def shard_order(self, epoch: int | None = None) -> list[int]:
        """The shards this rank reads in ``epoch`` (default: the current one, from ``start``), in
        the order it first reads them: what a prefetcher fetches next ([] for map-style data)."""
        if not self.shards:
            return []
        plan = self.plan(self.epoch if epoch is None else epoch)
        rest = plan[self.start:] if epoch is None else plan
        if not rest:
            return []
        ids = np.searchsorted([r.start for r in self.shards], np.concatenate(rest), "right") - 1
        _, first = np.unique(ids, return_index=True)
        return [int(i) for i in ids[np.sort(first)]]

    def __iter__(self) -> Iterator[BatchRequest]:
        plan = self.plan(self.epoch)
        ahead = getattr(self.reader, "plan_ahead", None)  # remote shards: prefetch in plan order
        for b in range(self.start, len(plan)):
            if ahead is not None:
                ahead(plan, b)
            slot = self.ring.acquire() if self.ring is not None else -1
            yield BatchRequest(plan[b], self.epoch, b, self.world.rank, slot)

    def __len__(self) -> int:
        return len(self.plan(self.epoch)) - self.start


__all__ = ["BatchRequest", "PlanSampler", "Segment", "Slots", "World", "order_spec",
           "plan_batches", "rng_for", "shuffle_buffer"]
