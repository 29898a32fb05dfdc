"""Shard-aware shuffling: each rank reads each of its shards once, inside one window
of ``shuffle_window`` shards; seeded, equal per rank, the same whatever ``num_workers``."""

from __future__ import annotations

import numpy as np
import pytest

import feedpipe
from feedpipe import Output, Sampler
from feedpipe.errors import ConfigError
from feedpipe.loader.order import OrderSpec, interleave
from feedpipe.loader.sampler import World

SIZES = [7, 9, 12, 3, 10, 10, 5, 8, 11, 6, 9, 4, 10, 7, 8, 12, 6, 5, 9, 10, 11, 3, 7, 8, 9]


def shard_ranges(sizes):
    ends = np.cumsum(sizes)
    return [range(int(e - s), int(e)) for s, e in zip(sizes, ends, strict=True)]


def spans(stream, shards):
    """Shard of each position, and per shard its (first, last) position in ``stream``."""
    owner = np.searchsorted([r.start for r in shards], stream, "right") - 1
    return owner, {int(s): (int(np.argmax(owner == s)), int(len(owner) - 1 -
                                                            np.argmax(owner[::-1] == s)))
                   for s in np.unique(owner)}


@pytest.mark.parametrize("window", [1, 2, 4])
@pytest.mark.parametrize("world", [1, 3])
def test_each_shard_is_read_within_one_window(window, world):
    shards = shard_ranges(SIZES)
    streams = OrderSpec(True, world, window, 0).build(sum(SIZES), shards, seed=3, epoch=1)
    assert sorted(interleave(streams).tolist()) == list(range(sum(SIZES)))  # each sample once
    for stream in streams:
        owner, span = spans(stream, shards)
        for first, last in span.values():
            # only shards of the same window are read while this one is: < 2k of them
            assert len(np.unique(owner[first: last + 1])) <= 2 * window - 1
        if window == 1:  # one shard at a time: shards are read whole, one after another
            assert all(len(np.unique(owner[a: b + 1])) == 1 for a, b in span.values())
    ranks = [{int(s) for s in spans(st, shards)[0]} for st in streams]
    assert sum(len(r) for r in ranks) == len(SIZES)  # whole shards, each on one rank
    again = OrderSpec(True, world, window, 0).build(sum(SIZES), shards, seed=3, epoch=1)
    other = OrderSpec(True, world, window, 0).build(sum(SIZES), shards, seed=3, epoch=2)
    assert all(np.array_equal(a, b) for a, b in zip(streams, again, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(streams, other, strict=True))


def test_window_loader_is_the_same_whatever_num_workers(packed):
    """The WebDataset default (shuffle_window=8) through real worker processes, and the
    prefetcher's shard order: every shard once, on one rank, in reading order."""
    kw = dict(size=16, device="cpu", fields=["path"], seed=2, output=Output(dtype="uint8"))
    runs = [[p for b in feedpipe.make_loader(packed["wds"], 8, num_workers=w, **kw)
             for p in b["path"]] for w in (0, 2)]
    assert runs[0] == runs[1] and len(set(runs[0])) == 72
    one = feedpipe.make_loader(packed["wds"], 8, num_workers=0, sampler=Sampler(shuffle_window=1),
                               **kw)
    orders = []
    for r in range(2):
        ld = feedpipe.make_loader(packed["wds"], 8, num_workers=0,
                                  sampler=Sampler(shuffle_window=1, world=World(r, 2)), **kw)
        orders.append(ld.planner.shard_order(0))
        seen = [p for b in ld for p in b["path"]]
        reader = feedpipe.open_dataset(packed["wds"])
        shard_of = {reader[i]["path"]: s for s, rng in enumerate(reader.shard_ranges())
                    for i in rng}
        firsts = list(dict.fromkeys(shard_of[p] for p in seen))
        assert firsts == orders[r]  # reading order, each shard once (k=1: whole shards)
    assert sorted(orders[0] + orders[1]) == [0, 1, 2, 3]
    assert len(one.planner.shard_order(0)) == 4


def test_shuffle_window_is_checked(packed):
    with pytest.raises(ConfigError, match="shuffle_window"):
        feedpipe.make_loader(packed["wds"], 8, sampler=Sampler(shuffle_window=0))
