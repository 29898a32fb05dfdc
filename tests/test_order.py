"""The order seam (feedpipe.loader.order): a mix of datasets is an OrderSpec kind the sampler deals
and the position saves like any other, and remote prefetch is a declared DatasetReader method."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Sequence

import numpy as np
import pytest

import feedpipe
from feedpipe.dataset.formats.base import DatasetReader
from feedpipe.dataset.registry import open_dataset
from feedpipe.errors import ConfigError
from feedpipe.loader.config import LoaderConfig, Mix
from feedpipe.loader.mixing import MixOrder, open_mix
from feedpipe.loader.order import OrderSpec
from feedpipe.loader.sampler import PlanSampler, World
from feedpipe.loader.torch.backend import Requests

KW = dict(size=16, output=feedpipe.Output(dtype="uint8"), device="cpu", num_workers=0,
          fields=["label", "source"])


def test_a_mix_is_an_order_spec(packed):
    """The sampler of a mix follows a MixOrder: its one stream is the epoch's global order,
    dealt round-robin to ranks like any one-stream order."""
    cfg = LoaderConfig(batch_size=4, seed=3, mix=Mix([], weights=(0.25, 0.75), epoch_size=40))
    mix = open_mix([packed["lmdb"], packed["wds"]], cfg)
    ranks = [PlanSampler(mix, cfg, World(r, 2)) for r in range(2)]
    order = ranks[0].order
    assert isinstance(order, MixOrder) and isinstance(order, OrderSpec) and order.streams == 1
    (stream,) = order.build(len(mix), None, seed=3, epoch=0)
    assert len(stream) == 40 and int((stream >= len(mix.sources[0])).sum()) == 30
    dealt = [np.concatenate(s.plan(0)) for s in ranks]
    assert dealt[0].tolist() == stream[0::2].tolist() and dealt[1].tolist() == stream[1::2].tolist()
    assert order.to_dict() == {"shuffle": True, "streams": 1, "window": None, "buffer": 0}


def test_mix_longer_than_its_datasets_resumes(packed):
    """An epoch of a mix may hold more samples than its datasets (weights repeat some): a state
    saved past the datasets' size resumes with exactly the rest of the epoch (it was refused as
    'outside start..dataset size')."""
    srcs = [packed["lmdb"], packed["hdf5"]]
    n = sum(len(open_dataset(p)) for p in srcs)
    mix = feedpipe.Mix(srcs, weights=[0.5, 0.5], epoch_size=n + 40)
    kw = dict(seed=2, **KW)
    whole = [b["label"].tolist() for b in feedpipe.make_loader(mix, 8, **kw)]
    ld = feedpipe.make_loader(mix, 8, **kw)
    it = iter(ld)
    taken = (n + 16) // 8
    for _ in range(taken):
        next(it)
    state = ld.state_dict()
    assert state["samples"] > n
    again = feedpipe.make_loader(mix, 8, **kw)
    again.load_state_dict(state)
    assert [b["label"].tolist() for b in again] == whole[taken:]


def test_mix_state_refuses_another_order_kind(packed):
    """A mix's state names its order as one stream: a state whose order has a window or several
    streams is refused by name, and a plain dataset's state is refused by a mix."""
    srcs = [packed["lmdb"], packed["hdf5"]]
    state = feedpipe.make_loader(srcs, 8, seed=1, **KW).state_dict()
    bad = {**state, "order": {**state["order"], "streams": 2}}
    with pytest.raises(ConfigError, match="not a mix's order"):
        feedpipe.make_loader(srcs, 8, seed=1, **KW).load_state_dict(bad)
    plain = feedpipe.make_loader(packed["lmdb"], 8, seed=1, **{**KW, "fields": ["label"]})
    with pytest.raises(ConfigError, match="state is for the mix"):
        feedpipe.make_loader(srcs, 8, seed=1, **KW).load_state_dict(plain.state_dict())


class Watching(DatasetReader):
    """A local reader that records the sampler's plan_ahead calls (the declared hook)."""

    def __init__(self, inner: DatasetReader) -> None:
        self.__dict__.update(inner.__dict__)
        self.inner, self.calls = inner, []  # type: ignore[var-annotated]

    def _open(self) -> None:
        self.inner._ensure_open()

    def _visit(self, indices, fn, fields) -> None:  # type: ignore[no-untyped-def]
        self.inner._visit(indices, fn, fields)

    def plan_ahead(self, plan: Sequence[Sequence[int]], position: int) -> None:
        self.calls.append(position)


def test_plan_ahead_is_declared_and_called_in_plan_order(packed: dict[str, Path]):
    """Every reader has plan_ahead (local ones do nothing), and the request stream calls it once
    per batch it asks for, in order, from the resumed batch on (and on into the next epoch)."""
    reader = open_dataset(packed["lmdb"])
    assert reader.plan_ahead([[0, 1]], 0) is None  # declared: local data does nothing
    watched = Watching(reader)
    cfg = LoaderConfig(batch_size=16, seed=0)
    planner = PlanSampler(watched, cfg, World(0, 1))
    requests = Requests(planner, 0, None)
    requests.at = (0, 1)
    n = len(planner.plan(0))
    batches = list(itertools.islice(requests, n))  # epoch 0 from batch 1, then epoch 1's first
    assert watched.calls == [*range(1, n), 0]
    assert [(b.epoch, b.number) for b in batches] == [*((0, k) for k in range(1, n)), (1, 0)]
