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

import threading
from dataclasses import dataclass
from typing import Any, Literal, Sequence

import numpy as np

from ..dataset.formats.base import DatasetReader
from ..dataset.mixed import MixedReader
from .config import LoaderConfig, Uneven, World
from .mixing import MixOrder
from .order import OrderSpec, consumed, interleave, rng_for, shuffle_buffer


def plan_batches(streams: list[np.ndarray], rank: int, batch_size: int, *, drop_last: bool,
                 uneven: Uneven) -> list[np.ndarray]:
    """This rank's batches, with exactly the same count on every rank.

    ``uneven="pad"`` tops short ranks up by wrapping around their own stream (every sample is seen;
    a rank left with nothing, as after a resume with fewer samples left than ranks, wraps around
    the others' samples); ``"drop"`` trims long ranks to the shortest. ``drop_last`` drops the
    final partial batch. (``"mask"`` deals by :func:`plan_masked` instead.)
    """
    lengths = [len(s) for s in streams]
    target = max(lengths) if uneven == "pad" else min(lengths)
    mine = streams[rank]
    if target > len(mine):
        mine = np.resize(mine if len(mine) else np.concatenate(streams), target)  # wrap around
    mine = mine[:target]
    count = target // batch_size if drop_last else -(-target // batch_size)
    return [mine[b * batch_size: (b + 1) * batch_size] for b in range(count)]


def plan_masked(order: np.ndarray, world: World, batch_size: int) -> tuple[list[np.ndarray],
                                                                              list[int]]:
    """``uneven="mask"``: this rank's batches of ``order`` and how many rows of each are real.

    Step s gives rank r the contiguous block ``order[s*G + r*B : s*G + (r+1)*B]`` (G = B × world
    size), so the ranks' batches gathered in rank order are the global order itself, and every
    sample is counted exactly once. Every batch is full (one shape for ``torch.compile``): the last
    step's missing rows repeat the order's first samples and are marked not real, at the tail of
    the gathered step (what ``accelerate``'s ``gather_for_metrics`` trims).
    """
    b, g = batch_size, batch_size * world.size
    steps = -(-len(order) // g)
    batches, real = [], []
    for s in range(steps):
        lo = s * g + world.rank * b
        block = order[lo: lo + b]
        real.append(len(block))
        if len(block) < b:
            block = np.concatenate([block, np.resize(order, b - len(block))])
        batches.append(block)
    return batches, real


# --- the batch plan both backends iterate ---------------------------------------------------------

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
    """The order a fresh epoch of this loader follows (``window`` overrides the config's).

    ``uneven="mask"`` reads one global order at any world size (the same evaluation everywhere).
    A mix of datasets follows its own kind of order (:class:`~feedpipe.loader.mixing.MixOrder`).
    """
    if isinstance(reader, MixedReader):
        return MixOrder.of(reader, cfg)
    if not reader.shard_ranges():
        return OrderSpec(cfg.shuffle, 1, None, 0)  # map-style: the same order at any world size
    return OrderSpec(cfg.shuffle, 1 if cfg.sampler.uneven == "mask" else world.size,
                     cfg.sampler.shuffle_window if window == "config" else window,
                     cfg.sampler.shuffle_buffer)


@dataclass(frozen=True)
class Plan:
    """One epoch's plan on this rank: its batches, the length of every rank's stream (what a
    position counts) and the real rows of each batch (less than its length only under "mask")."""

    batches: list[np.ndarray]
    lengths: list[int]
    real: list[int]


class PlanSampler:
    """Both backends' batch order: this rank's batches of each epoch, as index arrays (plans
    only: the feed engine, :mod:`feedpipe.loader.position`, asks for them in order); sharded
    formats keep each rank on whole shards. Thread-safe: the feed thread plans the next epoch
    while the training thread reads the current one.

    A fresh epoch gives rank r stream r of :attr:`order`; ``resumed`` (set by
    :class:`~feedpipe.loader.position.EpochPosition` for the iteration a loaded state resumes)
    deals the rest of that epoch's global order round-robin instead.
    """

    def __init__(self, reader: DatasetReader, cfg: LoaderConfig, world: World) -> None:
        self.reader, self.cfg, self.world = reader, cfg, world
        self.shards = reader.shard_ranges()
        self.order = order_spec(reader, cfg, world)
        self.resumed: Segment | None = None
        self._cache: dict[tuple[int, Segment | None], Plan] = {}
        self._lock = threading.Lock()

    def segment(self, epoch: int) -> Segment | None:
        """The resumed segment when it is for ``epoch``; None: the epoch's fresh plan."""
        return self.resumed if self.resumed is not None and self.resumed.epoch == epoch else None

    def _build(self, epoch: int, seg: Segment | None) -> Plan:
        spec, start = (seg.order, seg.start) if seg else (self.order, 0)
        streams = spec.build(len(self.reader), self.shards, seed=self.cfg.seed, epoch=epoch,
                             warn=epoch == 0 and seg is None)
        size, cfg = self.world.size, self.cfg
        if cfg.sampler.uneven == "mask":
            rest = interleave(streams)[start:]
            batches, real = plan_masked(rest, self.world, cfg.batch_size)
            return Plan(batches, [len(rest)], real)
        if start or spec.streams != size:  # deal the global order (from ``start``) round-robin
            rest = interleave(streams)[start:]
            streams = [rest[r::size] for r in range(size)]
        batches = plan_batches(streams, self.world.rank, cfg.batch_size,
                               drop_last=cfg.drop_last, uneven=cfg.sampler.uneven)
        return Plan(batches, [len(s) for s in streams], [len(b) for b in batches])

    def _cached(self, epoch: int, fresh: bool = False) -> Plan:
        seg = None if fresh else self.segment(epoch)
        key = (epoch, seg)
        with self._lock:
            plan = self._cache.get(key)
            if plan is None:
                if len(self._cache) >= 4:  # this epoch's plan, its fresh twin, the next epoch's
                    self._cache.pop(next(iter(self._cache)))
                plan = self._cache[key] = self._build(epoch, seg)
        return plan

    def plan(self, epoch: int) -> list[np.ndarray]:
        """All of this rank's batches (index arrays) for ``epoch``."""
        return self._cached(epoch).batches

    def real(self, epoch: int, number: int) -> int:
        """Real (not padding) rows of batch ``number`` of ``epoch``; only "mask" marks padding."""
        return self._cached(epoch).real[number]

    def epoch_length(self, epoch: int) -> int:
        """Batches of ``epoch``'s fresh plan on this world: ``len(loader)``, resumed or not."""
        return len(self._cached(epoch, fresh=True).batches)

    def consumed(self, epoch: int, batches: int) -> int:
        """Samples of ``epoch``'s global order that ``batches`` batches on every rank have read,
        counted from the plan's start (padding repeats are not counted)."""
        lengths = self._cached(epoch).lengths
        if self.cfg.sampler.uneven == "mask":
            return min(lengths[0], batches * self.cfg.batch_size * self.world.size)
        return consumed(lengths, batches * self.cfg.batch_size)

    def shard_order(self, epoch: int, start: int = 0) -> list[int]:
        """The shards this rank reads in ``epoch`` from batch ``start``, in the order it first
        reads them: what a prefetcher fetches next ([] for map-style data)."""
        if not self.shards:
            return []
        rest = self.plan(epoch)[start:]
        if not rest:
            return []
        ids = np.searchsorted([r.start for r in self.shards], np.concatenate(rest), "right") - 1
        _, first = np.unique(ids, return_index=True)
        return [int(i) for i in ids[np.sort(first)]]


__all__ = ["BatchRequest", "Plan", "PlanSampler", "Segment", "World", "order_spec",
           "plan_batches", "plan_masked", "rng_for", "shuffle_buffer"]
