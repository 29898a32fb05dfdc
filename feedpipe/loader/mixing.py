"""The per-epoch order of a mix of datasets: each epoch takes its exact share of samples (by
``weights``) from each source's endless stream of seeded passes, so a down-weighted source sees
all its samples before any repeats; a seeded shuffle interleaves the sources.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Sequence, Union

import numpy as np

from ..dataset.mixed import MixedReader
from ..dataset.registry import DatasetReader, open_dataset
from ..errors import ConfigError
from .config import DEFAULT_FIELDS, LoaderConfig, Mix
from .order import OrderSpec, rng_for

Dataset = Union[str, "os.PathLike[str]", DatasetReader]
Sources = Union[Sequence[Dataset], Mapping[str, Dataset]]  # a list, or {name: dataset}
_MIX = 0x6D6978  # "mix": keeps the mix's generators apart from the sampler's


def epoch_counts(sizes: Sequence[int], weights: Sequence[float] | None,
                 epoch_size: int | None) -> list[int]:
    """Samples each source gives one epoch: ``epoch_size`` split by ``weights`` (default: the
    sizes) with largest remainders (ties to the earlier source)."""
    total = int(epoch_size) if epoch_size is not None else int(sum(sizes))
    w = np.asarray(weights if weights is not None else sizes, np.float64)  # (checked: open_mix)
    quota = total * w / w.sum()
    counts = np.floor(quota).astype(np.int64)
    extra = total - int(counts.sum())
    order = sorted(range(len(w)), key=lambda s: (-(quota[s] - counts[s]), s))
    for s in order[:extra]:
        counts[s] += 1
    return [int(c) for c in counts]


def _pass(n: int, source: int, p: int, seed: int, shuffle: bool,
          shards: Sequence[range] | None) -> np.ndarray:
    """Pass ``p`` over one source of ``n`` samples: a permutation, or its shards in seeded order,
    each shuffled within itself."""
    if not shuffle:
        return np.arange(n, dtype=np.int64)
    rng = rng_for(seed, _MIX, source, p)
    if not shards:
        return rng.permutation(n).astype(np.int64)
    return np.concatenate([shards[k].start + rng.permutation(len(shards[k])).astype(np.int64)
                           for k in rng.permutation(len(shards))])


def source_take(n: int, count: int, source: int, *, seed: int, epoch: int, shuffle: bool,
                shards: Sequence[range] | None = None) -> np.ndarray:
    """The ``count`` local indices source ``source`` gives ``epoch``: that slice of its passes."""
    if count == 0:
        return np.zeros(0, np.int64)
    lo, hi = epoch * count, (epoch + 1) * count
    parts = [_pass(n, source, p, seed, shuffle, shards)
             for p in range(lo // n, (hi - 1) // n + 1)]
    stream = np.concatenate(parts)
    start = lo - (lo // n) * n
    return stream[start: start + count]


@dataclass(frozen=True)
class MixOrder(OrderSpec):
    """A mix's epoch order: one stream of ``epoch_size`` mixed indices, planned per source by
    ``weights`` (equal when the sources' names and sizes, weights, epoch size and shuffle are)."""

    names: tuple[str, ...] = ()
    sizes: tuple[int, ...] = ()
    weights: tuple[float, ...] | None = None
    epoch_size: int | None = None
    shards: tuple[tuple[range, ...] | None, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def of(cls, reader: MixedReader, cfg: LoaderConfig) -> "MixOrder":
        """The order ``cfg`` (shuffle, weights, epoch size) gives the mix ``reader``."""
        shards = [s.shard_ranges() for s in reader.sources]
        mix = cfg.mix or Mix(())
        return cls(cfg.shuffle, 1, None, 0, tuple(reader.names), tuple(reader.sizes()),
                   None if mix.weights is None else tuple(mix.weights), mix.epoch_size,
                   tuple(tuple(r) if r else None for r in shards))

    def build(self, n: int, shards: Sequence[range] | None, *, seed: int,
              epoch: int, warn: bool = True) -> list[np.ndarray]:
        """The epoch's order as the one stream (the mix's own sizes and shards are used)."""
        counts = epoch_counts(self.sizes, self.weights, self.epoch_size)
        offsets = np.concatenate([[0], np.cumsum(self.sizes)]).astype(np.int64)
        takes = [offsets[s] + source_take(size, counts[s], s, seed=seed, epoch=epoch,
                                          shuffle=self.shuffle, shards=self.shards[s])
                 for s, size in enumerate(self.sizes)]
        labels = np.repeat(np.arange(len(self.sizes)), counts)
        if self.shuffle:
            labels = rng_for(seed, _MIX, epoch).permutation(labels)
        else:  # evenly spread: the j-th of c samples sits at (j + 1/2) / c of the epoch
            spread = np.concatenate([(np.arange(c) + 0.5) / c for c in counts if c])
            labels = labels[np.argsort(spread, kind="stable")]
        order = np.empty(len(labels), np.int64)
        for s, take in enumerate(takes):
            order[labels == s] = take
        return [order]

    def saved_with(self) -> dict[str, Any]:
        """The mix a state was saved on."""
        return {"mix": {"names": list(self.names), "sizes": list(self.sizes),
                        "weights": list(self.weights or ()), "epoch_size": self.epoch_size}}

    def restore(self, d: Any) -> "MixOrder":
        """This mix with the shuffle the state was saved with."""
        base = OrderSpec.from_dict(d)
        if (base.streams, base.window, base.buffer) != (1, None, 0):
            raise ConfigError(f"state 'order'={d!r} is not a mix's order (one stream, no window "
                              "or buffer)")
        return replace(self, shuffle=base.shuffle)

    def length(self, n: int) -> int:
        return int(self.epoch_size) if self.epoch_size is not None else int(sum(self.sizes))


def open_mix(sources: Sources, cfg: LoaderConfig) -> MixedReader:
    """``make_loader``'s mix: open each path, check the schemas on the fields to read."""
    named = dict(sources) if isinstance(sources, Mapping) else None
    items = list(named.values()) if named is not None else list(sources)
    readers = [s if isinstance(s, DatasetReader) else open_dataset(s) for s in items]  # or URLs
    mix = cfg.mix or Mix(())
    if mix.weights is not None and len(mix.weights) != len(readers):
        raise ConfigError(f"weights={mix.weights!r}: give one weight per dataset "
                          f"({len(readers)})", option="weights")
    fields = cfg.fields or tuple(n for n in DEFAULT_FIELDS if all(n in r.schema for r in readers))
    return MixedReader(readers, None if named is None else [str(k) for k in named],
                       fields=fields, classes=mix.classes)
