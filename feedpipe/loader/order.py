"""An epoch's global sample order: an :class:`OrderSpec` builds one stream per rank; their
:func:`interleave` is the global order, of which k batches on every rank read the first
``consumed(lengths, k * B)``, so a resume at any world size deals the rest anew.
"""

from __future__ import annotations

import functools
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import ConfigError

SAVED_WITH = ("mix",)  # the state keys beside "order" that some order kind saves (see saved_with)


def rng_for(*key: int) -> np.random.Generator:
    """A generator determined only by the non-negative integer key (seed, epoch, ...)."""
    return np.random.Generator(np.random.Philox(np.random.SeedSequence([int(k) for k in key])))


@functools.lru_cache(maxsize=16)
def _sample_key(seed: int) -> np.ndarray:
    """The Philox key of the seed's per-sample streams (its own: spawn key 1)."""
    return np.random.SeedSequence([seed], spawn_key=(1,)).generate_state(2, np.uint64)


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator a user ``transform`` gets for sample ``index`` of ``epoch``, wherever it
    lands: the seed's Philox key, the counter's high words (index, epoch), so no streams overlap."""
    return np.random.Generator(np.random.Philox(
        key=_sample_key(int(seed)), counter=[0, 0, int(index), int(epoch)]))


class SampleRngs:
    """:func:`sample_rng`'s generators at a tenth of the cost: the last one, its state reset,
    unless something else still holds it (a new Philox draws OS entropy: ~30 µs)."""

    def __init__(self) -> None:
        self._gen: np.random.Generator | None = None
        self._refs = (0, 0)  # the generator's and its bit generator's counts when only held here

    def __call__(self, seed: int, epoch: int, index: int) -> np.random.Generator:
        gen = self._gen
        if gen is None or (sys.getrefcount(gen), sys.getrefcount(gen.bit_generator)) \
                != self._refs:
            gen = self._gen = sample_rng(seed, epoch, index)
            self._refs = (sys.getrefcount(gen), sys.getrefcount(gen.bit_generator))
            return gen
        gen.bit_generator.state = {
            "bit_generator": "Philox",
            "state": {"counter": np.array([0, 0, int(index), int(epoch)], np.uint64),
                      "key": _sample_key(int(seed))},
            "buffer": np.zeros(4, np.uint64), "buffer_pos": 4, "has_uint32": 0, "uinteger": 0}
        return gen


def batch_seed(seed: int, epoch: int, rank: int, number: int) -> int:
    """The seed batch operations draw from for batch ``number`` of ``epoch`` on ``rank``."""
    ss = np.random.SeedSequence([int(seed), int(epoch), int(rank), int(number)], spawn_key=(2,))
    return int(ss.generate_state(1, np.uint64)[0] >> np.uint64(1))


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


def _concat(shards: Sequence[range]) -> np.ndarray:
    return np.concatenate([np.arange(s.start, s.stop, dtype=np.int64) for s in shards]) \
        if len(shards) else np.zeros(0, np.int64)


def window_shuffle(shards: Sequence[range], window: int, rng: np.random.Generator) -> np.ndarray:
    """The samples of ``shards`` permuted within ``len // window`` near-equal windows."""
    cuts = np.linspace(0, len(shards), max(1, len(shards) // window) + 1).round().astype(int)
    parts = [rng.permutation(_concat(shards[a:b])) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def interleave(streams: Sequence[np.ndarray]) -> np.ndarray:
    """The global order of ``streams``: element j of each (that has one), for j = 0, 1, ..."""
    if len(streams) == 1:
        return np.asarray(streams[0], np.int64)
    lengths = [len(s) for s in streams]
    step = np.concatenate([np.arange(n) for n in lengths]) if sum(lengths) else np.zeros(0, int)
    stream = np.repeat(np.arange(len(streams)), lengths)
    return np.concatenate(streams).astype(np.int64)[np.lexsort((stream, step))]


def consumed(lengths: Sequence[int], taken: int) -> int:
    """Samples of the global order that ``taken`` from the head of each stream cover."""
    return int(np.minimum(np.asarray(lengths, np.int64), taken).sum())


@dataclass(frozen=True)
class OrderSpec:
    """How an epoch's global order is built (saved in states): one seeded permutation, or shards
    dealt round-robin to ``streams`` streams, each shuffled by ``window`` shards or ``buffer``."""

    shuffle: bool = True
    streams: int = 1
    window: int | None = None
    buffer: int = 0

    def to_dict(self) -> dict[str, Any]:
        """What a state saves of the order (``saved_with`` adds what a kind adds to it)."""
        return {"shuffle": self.shuffle, "streams": self.streams, "window": self.window,
                "buffer": self.buffer}

    def saved_with(self) -> dict[str, Any]:
        """State entries (keys among :data:`SAVED_WITH`) that a resume must match exactly."""
        return {}

    def restore(self, d: Any) -> "OrderSpec":
        """The order that saved ``d`` (its :meth:`to_dict`; ``saved_with`` already matched)."""
        return OrderSpec.from_dict(d)

    def length(self, n: int) -> int:
        """Samples in an epoch's global order over a dataset of ``n`` samples."""
        return n

    @classmethod
    def from_dict(cls, d: Any) -> "OrderSpec":
        """The spec a state dict recorded; a malformed one is a ConfigError naming the key."""
        if not isinstance(d, dict) or set(d) != {"shuffle", "streams", "window", "buffer"}:
            raise ConfigError(f"state 'order' must be a dict with shuffle, streams, window and "
                              f"buffer; got {d!r}")

        def count(key: str, low: int) -> int:
            v = d[key]
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ConfigError(f"state 'order'[{key!r}]={v!r}: expected an int >= {low}")
            return v

        if not isinstance(d["shuffle"], bool):
            raise ConfigError(f"state 'order'['shuffle']={d['shuffle']!r}: expected a bool")
        return cls(d["shuffle"], count("streams", 1),
                   None if d["window"] is None else count("window", 1), count("buffer", 0))

    def build(self, n: int, shards: Sequence[range] | None, *, seed: int,
              epoch: int, warn: bool = True) -> list[np.ndarray]:
        """The epoch's streams of sample indices (``warn``: when too few shards to deal)."""
        rng, w = rng_for(seed, epoch), self.streams
        if shards is None or len(shards) == 0:
            order = rng.permutation(n) if self.shuffle else np.arange(n)
            return [order[r::w] for r in range(w)]
        shard_order = rng.permutation(len(shards)) if self.shuffle else np.arange(len(shards))
        if len(shards) < w:
            if warn:
                warnings.warn(f"{len(shards)} shards for {w} ranks: splitting by sample instead "
                              "of by shard (write more, smaller shards to keep reads "
                              "shard-local)", stacklevel=4)
            ordered = [shards[s] for s in shard_order]
            flat = self._within(ordered, rng) if self.shuffle else _concat(ordered)
            return [flat[r::w] for r in range(w)]
        return [self._within([shards[s] for s in shard_order[r::w]], rng_for(seed, epoch, r + 1))
                if self.shuffle else _concat([shards[s] for s in shard_order[r::w]])
                for r in range(w)]

    def _within(self, shards: Sequence[range], rng: np.random.Generator) -> np.ndarray:
        """One stream's samples, shuffled shard-locally (window) or by the shuffle buffer."""
        if self.window is not None:
            return window_shuffle(shards, self.window, rng)
        return shuffle_buffer(_concat(shards), self.buffer, rng)
